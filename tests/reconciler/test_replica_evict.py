"""One replica drained, stopped or restarted by an operator (docs/operations.md, "One
replica"): its node and the model's other replicas are left alone."""

import pytest

from fleet.models import Event, EventKind, Model, ReplicaState
from fleet.services import drain, permissions
from tests.factories import add_model, add_node, grant, operator, staff_user
from tests.reconciler.helpers import Clock, desired, make_ready, replicas, report, running

pytestmark = pytest.mark.django_db


def two_ready_replicas(nodes=("gpu-01", "gpu-02")):
    for n in nodes:
        add_node(n)
    model = add_model(replicas=2, gpus_per_node=8, tp=8, engine="vllm")  # a node each
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    return model, clock


def on(model, node_id):
    (r,) = [r for r in replicas(model) if r.shards.filter(node_id=node_id).exists()]
    return r


def events(model) -> list[str]:
    return list(
        Event.objects.filter(model=model, kind=EventKind.REPLICA)
        .order_by("id")
        .values_list("reason", flat=True)
    )


def test_a_drain_places_a_replacement_first_then_drains_that_replica_alone():
    model, clock = two_ready_replicas()
    victim, other = on(model, "gpu-01"), on(model, "gpu-02")
    (old,) = [s for s in running(model) if s.node_id == "gpu-01"]
    add_node("gpu-03")

    changed, text = drain.evict_replica(victim, "drain", operator("alice"))
    clock.pass_()

    assert changed and "drain of" in text and "a replacement is placed first" in text
    # a replacement starts on gpu-03 while both replicas keep serving
    (new,) = [s for s in running(model) if s.node_id == "gpu-03"]
    assert desired("gpu-01") == {old.pk: "running"}
    assert {victim.pk: "ready", other.pk: "ready"}.items() <= {
        r.pk: r.state for r in replicas(model)
    }.items()

    # the replacement is ready: that replica drains, and only it
    report(new, "ready")
    clock.pass_()
    assert desired("gpu-01") == {old.pk: "draining"}
    states = {r.pk: r.state for r in replicas(model)}
    assert states[victim.pk] == "draining" and states[other.pk] == "ready"
    assert (
        not model.__class__.objects.get(pk=model.pk)
        .replicas.filter(shards__node__cordoned=True)
        .exists()
    ), "no node was cordoned"

    # in-flight requests done: it stops, and the event log tells the story
    report(old, "stopped")
    clock.pass_()
    assert desired("gpu-01") == {}
    assert Model.objects.get(pk=model.pk).desired_replicas == 2
    said = events(model)
    assert said[0].startswith(f"drain of {victim} asked by user 'alice'")
    assert said[1].endswith("(drain asked by user 'alice'): its replacement is ready: draining")
    assert said[2].endswith("drained and stopped")


def test_a_drain_with_no_room_for_a_replacement_waits_then_drains_anyway(settings):
    model, clock = two_ready_replicas()
    victim = on(model, "gpu-01")
    (old,) = [s for s in running(model) if s.node_id == "gpu-01"]
    settings.LLMGW = {**settings.LLMGW, "REPLICA_DRAIN_WAIT_S": 60}

    drain.evict_replica(victim, "drain", operator())
    clock.advance(55, alive=["gpu-01", "gpu-02"])
    assert desired("gpu-01") == {old.pk: "running"}, "kept while a replacement may come"

    clock.advance(10, alive=["gpu-01", "gpu-02"])
    assert desired("gpu-01") == {old.pk: "draining"}
    assert "no replacement was ready within 60 s: draining it anyway" in events(model)[-1]


def test_a_stop_drains_now_and_the_model_wants_one_fewer():
    model, clock = two_ready_replicas()
    victim = on(model, "gpu-01")
    (old,) = [s for s in running(model) if s.node_id == "gpu-01"]

    drain.evict_replica(victim, "stop", operator())
    clock.pass_()

    assert desired("gpu-01") == {old.pk: "draining"}
    assert Model.objects.get(pk=model.pk).desired_replicas == 1
    report(old, "stopped")
    clock.pass_()
    clock.pass_()
    assert len([r for r in replicas(model) if r.state != ReplicaState.STOPPED]) == 1


def test_a_restart_drains_now_and_a_new_replica_takes_its_place():
    model, clock = two_ready_replicas()
    victim = on(model, "gpu-01")
    (old,) = [s for s in running(model) if s.node_id == "gpu-01"]

    drain.evict_replica(victim, "restart", operator())
    clock.pass_()
    assert desired("gpu-01") == {old.pk: "draining"}
    report(old, "stopped")
    clock.pass_()
    clock.pass_()

    # the same node, now free, takes the new one; the model still wants two
    (again,) = [s for s in running(model) if s.node_id == "gpu-01"]
    assert again.pk != old.pk and again.replica_id != victim.pk
    assert Model.objects.get(pk=model.pk).desired_replicas == 2


def test_asking_twice_or_for_a_stopped_replica_changes_nothing_and_says_so():
    model, clock = two_ready_replicas()
    victim = on(model, "gpu-01")
    user = operator()

    assert drain.evict_replica(victim, "drain", user)[0]
    changed, text = drain.evict_replica(victim, "stop", user)
    assert not changed and text.endswith("drain was asked already, by user 'ops'")
    assert Model.objects.get(pk=model.pk).desired_replicas == 2
    with pytest.raises(ValueError, match="unknown action 'kill' \\(known: drain, stop, restart\\)"):
        drain.evict_replica(victim, "kill", user)


def test_only_the_drain_replica_permission_may_take_a_replica_out():
    model, clock = two_ready_replicas()
    victim = on(model, "gpu-01")
    viewer = grant(staff_user("viewer"), "fleet.view_replica", "fleet.change_model")

    with pytest.raises(permissions.Refused, match="needs the permission fleet.drain_replica"):
        drain.evict_replica(victim, "stop", viewer)

    assert Model.objects.get(pk=model.pk).desired_replicas == 2
    assert not events(model)
    victim.refresh_from_db()
    assert victim.evict == ""
    assert drain.evict_replica(victim, "stop", grant(viewer, "fleet.drain_replica"))[0]
