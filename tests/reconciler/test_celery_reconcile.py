"""The reconciler as it runs in production: a real Celery worker and beat on a real Redis."""

import time
from contextlib import contextmanager

import pytest

from fleet.models import FleetStatus, Shard
from fleet.services.reconciler import lock
from tests.factories import add_model, add_node
from tests.processes import start_celery, stop_all

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def wait_for(check, timeout, what, logs):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    out = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
    raise AssertionError(f"{what} did not happen within {timeout} s\n{out}")


@pytest.fixture
def celery_stack(tmp_path):
    worker = start_celery(
        tmp_path,
        "worker",
        [
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            "2",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        LLMGW_RECONCILE_INTERVAL_S=1,
    )
    beat = start_celery(
        tmp_path,
        "beat",
        ["beat", "--loglevel", "INFO", "-s", str(tmp_path / "beat-schedule")],
        LLMGW_RECONCILE_INTERVAL_S=1,
    )
    yield [worker[1], beat[1]]
    stop_all([beat[0], worker[0]], timeout=15)


def passes():
    status = FleetStatus.objects.filter(pk=1).first()
    return status.passes if status else 0


@contextmanager
def holding_the_pass_lock(timeout: float = 30):
    """Take the reconciler's lock as another worker would: when no pass holds it.

    Beat runs a pass every second here, so a first try can meet one running.
    """
    deadline = time.monotonic() + timeout
    while True:
        with lock.pass_lock() as got:
            if got:
                yield
                return
        assert time.monotonic() < deadline, f"no free moment for the pass lock in {timeout:g} s"
        time.sleep(0.05)


def test_beat_runs_passes_that_place_and_the_lock_keeps_them_one_at_a_time(celery_stack):
    add_node("gpu-01")
    model = add_model(replicas=1)

    # beat (every second here) and the kick after the catalog edit run passes
    wait_for(
        lambda: Shard.objects.filter(replica__model=model).count() == 1,
        60,
        "placing the first replica",
        celery_stack,
    )
    assert Shard.objects.get().node_id == "gpu-01"

    # while another holder has the lock, beat's passes are skipped, not queued up
    with holding_the_pass_lock():
        held_at = passes()
        model.desired_replicas = 2
        model.save()
        time.sleep(3)  # three beats, each finding the lock held
        assert passes() == held_at
        assert Shard.objects.filter(replica__model=model).count() == 1

    wait_for(
        lambda: Shard.objects.filter(replica__model=model).count() == 2,
        30,
        "placing the second replica once the lock was free",
        celery_stack,
    )
    status = FleetStatus.objects.get()
    assert status.passes > held_at and status.last_pass_ms is not None
