"""Reliability row 11: reconciler passes racing each other.

Two beats at once, two workers, 100 passes asked for at the same moment from 50
threads while a model scales, then the only worker killed -9 in the middle of a
pass while it scales again. One lock lets one pass run at a time; whatever
happens, no replica gets a second shard and no engine is started twice.
"""

import subprocess
import sys
import time

import psutil
import pytest
import redis
from django.db import connection

from fleet.models import Node, Replica, Shard
from fleet.services.reconciler.lock import ADVISORY_LOCK_ID
from tests.e2e.helpers import (
    apply_model,
    duplicate_shards,
    engine_processes,
    engine_starts,
    live_shards,
    passes,
    ready_shards,
    wait_passes,
)
from tests.processes import ROOT, start_celery, subprocess_env
from tests.processes.stack import CELERY_WORKER

pytestmark = pytest.mark.django_db(transaction=True)


def pass_lock_held(stack):
    """Whether some worker holds the reconciler's lock, as fleet.services.reconciler.lock
    takes it: an advisory lock on PostgreSQL, a Redis key otherwise."""
    if connection.vendor == "postgresql":

        def held() -> bool:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM pg_locks"
                    " WHERE locktype = 'advisory' AND objid = %s AND granted",
                    [ADVISORY_LOCK_ID],
                )
                return cur.fetchone()[0] > 0

        return held
    client = redis.Redis.from_url(stack.redis.url)
    lock_key = f"{subprocess_env()['LLMGW_CHANNEL_PREFIX']}:reconcile:lock"
    return lambda: bool(client.exists(lock_key))


ASKERS = 50
# Each thread asks the way a change does (coalesced by ask.request_reconcile) and
# also queues a pass of its own, so that many passes really do race for the lock.
ASK_AT_ONCE = f"""
import threading
import django
django.setup()
from llmgw_site.celery import app
from fleet.services.reconciler import ask, lock
barrier = threading.Barrier({ASKERS})
def one():
    barrier.wait()
    ask.request_reconcile()
    app.send_task(ask.TASK, queue=lock.prefix())
threads = [threading.Thread(target=one) for _ in range({ASKERS})]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("asked", {ASKERS})
"""


def ask_at_once(stack) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", ASK_AT_ONCE],
        cwd=ROOT,
        env=subprocess_env(**stack.env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def kill_9_with_pool(proc: subprocess.Popen) -> None:
    """SIGKILL a Celery worker and its pool processes, the one running the pass among them."""
    parent = psutil.Process(proc.pid)
    for p in [*parent.children(recursive=True), parent]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def no_duplicates() -> dict:
    replicas = Replica.objects.filter(model__name="tiny-llama").exclude(state="stopped").count()
    return {"replicas": replicas, "duplicate_shards": duplicate_shards()}


def test_two_beats_100_passes_at_once_and_a_worker_killed_mid_pass_duplicate_nothing(
    stack, tiny_model, record
):
    # given: two agents, a second worker and a second beat beside the stack's own
    agents = [stack.add_agent("cpu-a"), stack.add_agent("cpu-b")]
    stack.wait(lambda: Node.objects.filter(connected=True).count() == 2, "both agents")
    stack.celery.append(start_celery(stack.tmp, "worker-extra", CELERY_WORKER, **stack.env))
    stack.celery.append(
        start_celery(
            stack.tmp,
            "beat-extra",
            ["beat", "--loglevel", "INFO", "-s", str(stack.tmp / "beat-schedule-extra")],
            **stack.env,
        )
    )
    model_id = apply_model(stack, tiny_model)
    stack.wait(lambda: len(ready_shards()) == 1, "the first replica")

    # when: the model scales to 3 while 50 threads ask for passes at the same moment
    stack.api("patch", f"models/{model_id}/", json={"desired_replicas": 3})
    asked = ask_at_once(stack)
    out, _ = asked.communicate(timeout=60)
    assert asked.returncode == 0, out
    stack.wait(lambda: len(ready_shards()) == 3, "3 ready replicas", 180)
    wait_passes(stack, 5)
    first = no_duplicates()

    # when: one worker is left, and it is killed -9 while it holds the pass lock,
    # with a scale-up and another 100 queued passes in front of it
    worker, _ = stack.celery[0]
    extra, _ = stack.celery[2]
    extra.terminate()
    extra.wait(30)
    stack.api("patch", f"models/{model_id}/", json={"desired_replicas": 4})
    asked = ask_at_once(stack)
    held = stack.wait(pass_lock_held(stack), "a pass to hold the lock", 30)
    kill_9_with_pool(worker)
    killed_at = time.monotonic()
    asked.communicate(timeout=60)
    passes_at_kill = passes()
    stack.celery.append(start_celery(stack.tmp, "worker-again", CELERY_WORKER, **stack.env))

    # then: passes resume (after the lock's expiry, if the killed pass held it)
    stack.wait(lambda: passes() > passes_at_kill, "a pass after the kill", 120)
    resumed_s = time.monotonic() - killed_at
    stack.wait(lambda: len(ready_shards()) == 4, "4 ready replicas", 180)
    wait_passes(stack, 5)

    # and nothing is doubled: one shard per replica, one engine per shard, each started once
    second = no_duplicates()
    placed = Shard.objects.filter(replica__model__name="tiny-llama").count()
    found = [e for a in agents for e in engine_processes(a.state_dir)]
    starts = engine_starts(stack)
    restarts = sum(s.replica.restarts for s in live_shards())
    record(
        "11",
        beats=2,
        workers=2,
        passes_asked_at_once=2 * ASKERS,
        killed_holding_lock=bool(held),
        passes_resumed_after_kill_s=round(resumed_s, 1),
        duplicate_shards=first["duplicate_shards"] + second["duplicate_shards"],
        replicas=second["replicas"],
        shards_placed=placed,
        engine_starts=starts,
        engine_processes=len(found),
        restarts=restarts,
    )
    assert first == {"replicas": 3, "duplicate_shards": 0}
    assert second == {"replicas": 4, "duplicate_shards": 0}
    assert placed == 4 and len(found) == 4 and starts == 4
    assert sorted(sid for sid, _ in found) == sorted(s.pk for s in live_shards())
    assert restarts == 0
