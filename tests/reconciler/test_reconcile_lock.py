"""One pass at a time, and no request for a pass lost while one runs."""

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
    ask._kick()
    ask._kick()

    # then: only the first waited on Redis; the second, in the same thread a
    # socket or a request runs in, did not
    assert Down.calls == 1
