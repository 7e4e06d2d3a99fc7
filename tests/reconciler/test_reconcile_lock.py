"""One pass at a time, and no request for a pass lost while one runs."""

import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from django.db import connection

from fleet.models import FleetStatus
from fleet.services.reconciler import ask, runner
from fleet.services.reconciler import lock as reconciler_lock
from tests.factories import add_model, add_node
from tests.reconciler.helpers import running

pytestmark = pytest.mark.django_db


@contextmanager
def held_elsewhere():
    """The reconciler lock, held by another process's connection."""
    if connection.vendor == "postgresql":
        import psycopg

        s = connection.settings_dict
        conn = psycopg.connect(
            dbname=s["NAME"],
            user=s["USER"],
            host=s["HOST"] or None,
            port=s["PORT"] or None,
            password=s["PASSWORD"] or None,
            autocommit=True,
        )
        conn.execute("SELECT pg_advisory_lock(%s)", [reconciler_lock.ADVISORY_LOCK_ID])
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [reconciler_lock.ADVISORY_LOCK_ID])
            conn.close()
    else:
        lock = reconciler_lock.redis_client().lock(reconciler_lock.key("lock"), timeout=30)
        assert lock.acquire(blocking=False)
        try:
            yield
        finally:
            lock.release()


def passes():
    status = FleetStatus.objects.filter(pk=1).first()
    return status.passes if status else 0


def test_a_pass_asked_for_while_another_runs_is_run_by_the_holder():
    add_node("gpu-01")
    model = add_model()
    reconciler_lock.take_again()  # nothing left over from another test

    with held_elsewhere():
        assert runner.run_locked() is None  # skipped, not queued behind it
        assert passes() == 0

    # the holder finishes and looks for notes: it runs the pass that was asked for
    report = runner.run_locked()
    assert report is not None
    assert passes() == 2  # its own pass, then the one asked for
    assert len(running(model)) == 1
    assert not reconciler_lock.take_again()


def test_without_contention_one_pass_runs():
    add_node("gpu-01")
    reconciler_lock.take_again()

    runner.run_locked()

    assert passes() == 1


def test_with_redis_down_changes_stop_asking_for_a_while_and_beat_covers(monkeypatch):
    import redis

    class Down:
        calls = 0

        def set(self, *args, **kwargs):
            Down.calls += 1
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379")

    # given: Redis is down
    monkeypatch.setattr(reconciler_lock, "_client", Down())
    monkeypatch.setattr(ask, "_kicks_off_until", 0.0)

    # when: two changes ask for a pass
    ask.request_reconcile_now()
    ask.request_reconcile_now()

    # then: only the first waited on Redis; the second, in the same thread a
    # socket or a request runs in, did not
    assert Down.calls == 1


def test_the_embedded_lock_outlives_its_expiry_while_the_pass_runs(monkeypatch):
    # A pass longer than the lock's expiry keeps it: the holder's thread renews it.
    monkeypatch.setattr(reconciler_lock, "LOCK_TTL_S", 0.6)
    client = reconciler_lock.redis_client()
    key = reconciler_lock.key("lock")
    client.delete(key)

    with reconciler_lock.redis_pass_lock() as got:
        assert got
        time.sleep(2)  # over three expiries
        with reconciler_lock.redis_pass_lock() as second:
            assert not second  # a second pass still finds it held
        assert client.exists(key)

    assert not client.exists(key)  # released at the end of the pass


HOLD_AND_WAIT = """
import sys, time, django
django.setup()
from fleet.services.reconciler import lock
with lock.redis_pass_lock() as got:
    print("held" if got else "busy", flush=True)
    time.sleep(600)
"""


@pytest.mark.live
def test_a_holder_killed_9_frees_the_embedded_lock_within_its_expiry():
    # A worker killed in the middle of a pass stops renewing: passes resume within
    # LOCK_TTL_S (10 s), not after a minute.
    from tests.processes import ROOT, subprocess_env

    client = reconciler_lock.redis_client()
    key = reconciler_lock.key("lock")
    client.delete(key)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_WAIT],
        cwd=ROOT,
        env=subprocess_env(DJANGO_SETTINGS_MODULE="llmgw_site.settings"),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert client.exists(key)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        deadline = time.monotonic() + 2 * reconciler_lock.LOCK_TTL_S
        while client.exists(key) and time.monotonic() < deadline:
            time.sleep(0.2)
        with reconciler_lock.redis_pass_lock() as got:
            assert got, f"the dead holder's lock still held {2 * reconciler_lock.LOCK_TTL_S} s on"
    finally:
        holder.kill()
        holder.wait()
