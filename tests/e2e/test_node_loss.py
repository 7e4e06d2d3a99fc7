"""A node that goes silent has its replica replaced elsewhere; back, its duplicate stops."""

import pytest

from fleet.models import Model, Node
from tests.e2e.helpers import answers, apply_model, live_shards, wait_serving

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_silent_node_is_lost_its_replica_replaced_and_its_duplicate_stopped_on_return(
    stack, tiny_model
):
    # given: the model on a first agent, a second agent beside it, and a model-level
    # replace deadline short enough for a test (the fleet default is 300 s)
    first = stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    (old,) = wait_serving(stack)
    assert old.node_id == "cpu-a"
    stack.add_agent("cpu-b")
    stack.wait(
        lambda: Node.objects.filter(pk="cpu-b", connected=True).exists(),
        "the second agent to register",
    )
    Model.objects.filter(name="tiny-llama").update(replace_after_s=10)
    old_pid = first.engines()[old.pk]

    # when: the first agent dies without a word; its engine runs on, unseen
    first.kill_9()

    # then: the node turns suspect (no new placements), and once the model's own
    # replace deadline has passed its replica is served from cpu-b; the node itself
    # is declared lost only at the fleet's deadline
    stack.wait(lambda: Node.objects.get(pk="cpu-a").state == "suspect", "cpu-a to be suspect")
    stack.wait(
        lambda: [s.node_id for s in live_shards() if s.state == "ready"] == ["cpu-b"],
        "the replica to be ready on cpu-b",
        timeout=120,
    )
    stack.wait(lambda: answers(stack), "the gateway to answer from cpu-b")

    # when: the first agent comes back, still holding the old engine
    first.start()

    # then: the node is ready again, the old engine is stopped as a duplicate,
    # and exactly one replica serves, on cpu-b
    stack.wait(lambda: Node.objects.get(pk="cpu-a").state == "ready", "cpu-a to be back")
    stack.wait(lambda: old_pid not in first.engines().values(), "the duplicate engine to stop")
    assert [s.node_id for s in live_shards()] == ["cpu-b"]
    assert answers(stack)
