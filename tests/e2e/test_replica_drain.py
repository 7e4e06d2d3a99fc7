"""Reliability row 15: one replica drained by an operator under a steady load of streams.

Its replacement is placed and ready first; then it leaves the routing table,
finishes what it has in flight and stops. The model's other replica and the
node are left alone, and clients see none of it (docs/operations.md, "One
replica").
"""

import time

import pytest

from fleet.models import Event, Node, Replica
from tests.e2e.helpers import apply_model, engine_processes, live_shards, wait_serving
from tests.processes import Load

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 4


def test_one_replica_drained_under_streams_fails_no_request(stack, tiny_model, record):
    # given: two replicas of the model on one node, clients streaming steadily
    agent = stack.add_agent("cpu-a")
    apply_model(stack, tiny_model, replicas=2)
    victim, other = wait_serving(stack, count=2)

    with Load(stack.url, stack.inference_key, clients=CLIENTS, stream_every=1) as load:
        load.wait_requests(60)
        # when: an operator drains one replica through the API
        started = time.monotonic()
        answer = stack.api("post", f"replicas/{victim.replica_id}/drain/")
        assert answer["changed"] and answer["replica"]["evict"] == "drain"

        # then: a replacement is ready while the victim still serves
        def replacement_ready():
            return [
                s for s in live_shards() if s.pk not in (victim.pk, other.pk) and s.state == "ready"
            ]

        (new,) = stack.wait(replacement_ready, "the replacement to be ready", 120)
        ready_s = time.monotonic() - started
        # and the victim drains and stops; the node is neither cordoned nor draining
        stack.wait(
            lambda: Replica.objects.get(pk=victim.replica_id).state == "stopped",
            "the drained replica to stop",
            120,
        )
        stopped_s = time.monotonic() - started
        load.wait_requests(60)
    figures = load.summary()

    # The replica is stopped in the database when its shard is told to stop; the
    # agent then stops its engine, a moment later on a busy machine.
    expected = sorted([other.pk, new.pk])

    def running():
        return sorted(sid for sid, _ in engine_processes(agent.state_dir))

    stack.wait(lambda: running() == expected, "only the other and the new engine to run", 30)
    other_untouched = Replica.objects.get(pk=other.replica_id).state == "ready"
    node = Node.objects.get(pk="cpu-a")
    assert other_untouched and not node.cordoned and not node.draining
    said = list(
        Event.objects.filter(kind="replica").order_by("id").values_list("reason", flat=True)
    )
    assert said[0].startswith("drain of tiny-llama#") and "asked by user" in said[0]
    assert said[1].endswith("its replacement is ready: draining")
    # done when its engine says so, or at the drain timeout (5 s here), whichever first
    assert said[2].endswith(("drained and stopped", "before its engine said it was done"))
    record(
        "15",
        replicas=2,
        replacement_ready_s=round(ready_s, 1),
        stopped_s=round(stopped_s, 1),
        other_untouched=other_untouched,
        clients=CLIENTS,
        **figures,
    )
    assert figures["streamed"] == figures["requests"]
    assert figures["failed"] == 0 and figures["broken"] == 0, figures
