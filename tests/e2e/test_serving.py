"""The whole path over real processes: the API, the reconciler on Celery, agentd, llama.cpp
and the gateway on Daphne; then an engine killed and an agent killed under it."""

import os
import signal

import pytest

from fleet.models import Node, Replica, Shard
from tests.e2e.helpers import answers, apply_model, live_shards, wait_passes, wait_serving

pytestmark = pytest.mark.django_db(transaction=True)


def registered(node_id):
    return Node.objects.filter(pk=node_id, connected=True, registered_at__isnull=False).first()


def test_a_model_applied_through_the_api_streams_through_the_gateway(stack, tiny_model):
    # given: one CPU node
    agent = stack.add_agent("cpu-a")
    stack.wait(lambda: registered("cpu-a"), "the agent to register")

    # when: an operator declares the model through the DRF API
    apply_model(stack, tiny_model)

    # then: it is placed there, the engine starts and becomes ready
    (shard,) = wait_serving(stack)
    assert shard.node_id == "cpu-a"
    lo, hi = agent.ports
    assert lo <= shard.port <= hi
    assert list(agent.engines()) == [shard.pk]

    # and the official client sees it and streams a completion through the gateway
    client = stack.openai(timeout=30)
    assert [m.id for m in client.models.list()] == ["tiny-llama"]
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=12,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    assert len(chunks) > 1, "a streamed answer arrives in pieces"
    assert {c.model for c in chunks} == {"tiny-llama"}
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert len({c.id for c in chunks}) == 1

    # and the replica is ready in the API too, its shard on the node
    (replica,) = stack.api("get", "replicas/", params={"state": "ready"})["results"]
    assert replica["model_name"] == "tiny-llama"
    assert [(s["node"], s["state"]) for s in replica["shards"]] == [("cpu-a", "ready")]


def test_a_killed_engine_is_reported_failed_restarted_and_serves_again(stack, tiny_model):
    agent = stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    (shard,) = wait_serving(stack)
    first_pid = agent.engines()[shard.pk]
    replica_id = shard.replica_id

    # when: the engine dies under the agent
    os.killpg(first_pid, signal.SIGKILL)

    # then: its shard is failed with what killed it, and the replica waits to restart
    seen_replica, seen_failed = set(), {}

    def back_again():
        seen_replica.add(Replica.objects.get(pk=replica_id).state)
        for s in Shard.objects.filter(replica_id=replica_id, state="failed"):
            seen_failed[s.pk] = (s.exit_code, s.error)
        new = [s for s in live_shards() if s.pk != shard.pk and s.state == "ready"]
        pids = agent.engines()
        return new and Replica.objects.get(pk=replica_id).state == "ready" and pids

    pids = stack.wait(back_again, "the replica to be ready again on a new engine")
    # The failed state lasts only the restart backoff (1 s here) before the row is
    # replaced, so a poll can miss it on a busy machine; the control plane's logs
    # keep what operators see, whichever way it went.
    logs = "".join(p.read_text(errors="replace") for p in stack.logs())
    if shard.pk not in seen_failed:
        line = next(
            x for x in logs.splitlines() if f"shard failed node=cpu-a shard={shard.pk}" in x
        )
        seen_failed[shard.pk] = (
            int(line.split("exit_code=")[1].split()[0]),
            line.split(" error=")[1].split(" exit_code=")[0],
        )
    assert seen_failed[shard.pk] == (-9, "the engine was killed by SIGKILL")
    assert "failed" in seen_replica or f"replica failed replica={replica_id}" in logs
    # the same replica came back with a new shard and a new engine process, and only one
    (new_shard,) = live_shards()
    assert new_shard.replica_id == replica_id and new_shard.pk != shard.pk
    assert list(pids) == [new_shard.pk] and pids[new_shard.pk] != first_pid
    stack.wait(lambda: answers(stack), "the gateway to answer from the restarted engine")


def test_an_agent_killed_with_sigkill_comes_back_and_adopts_its_engine(stack, tiny_model):
    agent = stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    (shard,) = wait_serving(stack)
    pid = agent.engines()[shard.pk]
    before = Node.objects.get(pk="cpu-a").registered_at

    # when: the agent dies without a word, and is started again on its credential
    agent.kill_9()
    assert answers(stack), "the engine serves on while its agent is gone"
    agent.start()

    # then: the node registers again, reporting the engine it found
    node = stack.wait(
        lambda: (n := registered("cpu-a")) and n.registered_at > before and n,
        "the agent to register again",
    )
    assert [s["shard_id"] for s in node.running_shards] == [shard.pk]
    wait_passes(stack, 3)
    # the same engine process goes on serving: adopted, not restarted, and no second copy
    assert answers(stack)
    assert agent.engines() == {shard.pk: pid}
    again = Shard.objects.get(pk=shard.pk)
    assert (again.state, again.replica.restarts, again.desired_state) == ("ready", 0, "running")
    assert [s.pk for s in live_shards()] == [shard.pk]
    assert "enrolled" not in agent.proc.output()
