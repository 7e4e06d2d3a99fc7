"""Reliability row 12: a node drained under a steady load of streamed completions.

The replacement starts elsewhere first; the old replica leaves the routing
table, finishes what it has in flight, and only then stops. Clients see none of it.
"""

import time

import pytest

from fleet.models import Node
from tests.e2e.helpers import apply_model, engine_processes, live_shards, wait_serving
from tests.processes import Load

pytestmark = pytest.mark.django_db(transaction=True)

# Streaming clients: enough for the ~50 streams a second asked of this row on a
# 2-core machine (they gave 63-83 there).
CLIENTS = 6


def test_drain_under_a_steady_load_of_streams_fails_no_request(stack, tiny_model, record):
    # given: the model on cpu-a, a second node beside it, clients streaming steadily
    first = stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    (old,) = wait_serving(stack)
    assert old.node_id == "cpu-a"
    second = stack.add_agent("cpu-b")
    stack.wait(lambda: Node.objects.filter(pk="cpu-b", connected=True).exists(), "cpu-b")

    with Load(stack.url, stack.inference_key, clients=CLIENTS, stream_every=1) as load:
        load.wait_requests(100)
        # when: an operator drains cpu-a through the API
        started = time.monotonic()
        stack.api("post", "nodes/cpu-a/drain/")
        # then: the node ends drained and its engine stops, the replica served from cpu-b
        stack.wait(
            lambda: (n := Node.objects.get(pk="cpu-a")).cordoned and not n.draining,
            "cpu-a to be drained",
            120,
        )
        drained_s = time.monotonic() - started
        stack.wait(lambda: not engine_processes(first.state_dir), "cpu-a's engine to stop")
        load.wait_requests(100)
    figures = load.summary()

    (new,) = live_shards()
    record("12", drained_s=round(drained_s, 1), clients=CLIENTS, **figures)
    assert new.node_id == "cpu-b" and new.state == "ready"
    assert [sid for sid, _ in engine_processes(second.state_dir)] == [new.pk]
    assert figures["streamed"] == figures["requests"]
    assert figures["failed"] == 0 and figures["broken"] == 0, figures
