"""Replicas moving between two agents on one machine, and the control plane's own outages:
Redis gone for 10 s, Daphne and Celery restarted. Nothing may be duplicated."""

import subprocess
import sys
import threading
import time

import pytest

from fleet.models import Node, Shard
from tests.e2e.helpers import answers, apply_model, live_shards, passes, wait_passes, wait_serving
from tests.processes import ROOT, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


class Traffic:
    """Requests through the gateway, one after another, until stopped; each result kept."""

    def __init__(self, stack):
        self.stack = stack
        self.results: list[str | None] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.results.append(answers(self.stack))
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(60)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if not r)


def node(node_id):
    return Node.objects.get(pk=node_id)


def test_draining_the_first_agent_moves_the_replica_to_a_second_one_without_a_failed_request(
    stack, tiny_model
):
    # given: the model served by a first agent, and a second agent on the same machine
    first = stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    (old,) = wait_serving(stack)
    assert old.node_id == "cpu-a"
    second = stack.add_agent("cpu-b")
    stack.wait(
        lambda: Node.objects.filter(pk="cpu-b", connected=True).exists(),
        "the second agent to register",
    )
    assert set(first.ports).isdisjoint(range(second.ports[0], second.ports[1] + 1))

    # when: an operator drains the first node while clients keep calling
    with Traffic(stack) as traffic:
        done = subprocess.run(
            [sys.executable, "manage.py", "drain", "cpu-a", "--wait", "--no-input"]
            + ["--timeout", "120"],
            cwd=ROOT,
            env=subprocess_env(**stack.env),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        # a few more requests once it has moved
        count = len(traffic.results)
        stack.wait(lambda: len(traffic.results) >= count + 3, "requests after the drain")

    # then: the replica runs on the second node only, and no request failed on the way
    assert "drained" in done.stdout
    (new,) = live_shards()
    assert new.node_id == "cpu-b" and new.state == "ready"
    assert traffic.results and traffic.failed == 0, traffic.results
    stack.wait(lambda: not first.engines(), "the first node's engine to stop")
    assert list(second.engines()) == [new.pk]
    a = node("cpu-a")
    assert (a.cordoned, a.draining) == (True, False)


def test_redis_stopped_for_10_s_then_started_everything_recovers_and_nothing_is_duplicated(
    stack, tiny_model
):
    agent = stack.add_agent("cpu-a")
    model_id = apply_model(stack, tiny_model)
    (shard,) = wait_serving(stack)
    pid = agent.engines()[shard.pk]

    # when: Redis (channel layer and Celery broker) is gone for 10 s
    stack.redis.stop()
    with Traffic(stack) as traffic:
        time.sleep(10)
    stack.redis.start()

    # then: the gateway went on serving from its in-memory table the whole time
    assert traffic.results and traffic.failed == 0, traffic.results

    # and the control plane acts again: a change made now reaches the agent
    stack.api("patch", f"models/{model_id}/", json={"desired_replicas": 2})
    shards = wait_serving(stack, count=2, timeout=180)

    # nothing was duplicated or restarted: the first engine is the same process
    engines = agent.engines()
    assert sorted(engines) == sorted(s.pk for s in shards)
    assert engines[shard.pk] == pid
    assert Shard.objects.get(pk=shard.pk).replica.restarts == 0
    n = node("cpu-a")
    assert (n.state, n.connected) == ("ready", True)


def test_web_and_celery_restarted_adopt_the_running_shard_without_a_second_engine(
    stack, tiny_model
):
    agent = stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    (shard,) = wait_serving(stack)
    pid = agent.engines()[shard.pk]
    before = node("cpu-a").registered_at

    # when: the whole control plane goes down and comes back
    stack.stop_control_plane()
    assert agent.engines() == {shard.pk: pid}, "engines do not depend on the control plane"
    down_passes = passes()
    stack.start_control_plane()

    # then: the agent registers again with its running shard, and passes run over it
    stack.wait(
        lambda: (n := node("cpu-a")).connected and n.registered_at > before,
        "the agent to register with the new Daphne",
    )
    stack.wait(lambda: passes() > down_passes, "the new worker's first pass")
    wait_passes(stack, 3)
    wait_serving(stack)

    # the shard was adopted: the same engine process, no restart, nothing placed again
    assert agent.engines() == {shard.pk: pid}
    assert [s.pk for s in live_shards()] == [shard.pk]
    assert Shard.objects.get(pk=shard.pk).replica.restarts == 0
