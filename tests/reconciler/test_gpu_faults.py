"""GPU faults and notices in the reconciler (docs/operations.md, "GPU faults and notices"):
a failed GPU's replicas move, replacements first; a degraded one is only cordoned; the
brake bounds a burst; a notice drains the node before its deadline."""

import pytest

from agentd import protocol
from fleet.models import GPU, Event, EventKind, FleetStatus, GPUHealth, Node
from fleet.services import drain, gpu_health, permissions
from tests.factories import add_model, add_node, grant, staff_user
from tests.reconciler.helpers import Clock, desired, make_ready, report, running

pytestmark = pytest.mark.django_db


def events(node_id: str, *found, slowdowns=()) -> None:
    """The node's agent reports these (gpu_index, kind, xid) events, as the socket would."""
    msg = protocol.parse_agent_message(
        {
            "type": "gpu_events",
            "v": 1,
            "events": [{"gpu_index": i, "kind": k, "xid": x} for i, k, x in found],
            "slowdowns": [{"gpu_index": i, "reasons": r} for i, r in slowdowns],
        }
    )
    gpu_health.apply_gpu_events(node_id, msg)


def gpu(node_id: str, index: int) -> GPU:
    return GPU.objects.get(node_id=node_id, index=index)


def gpu_of(shard) -> tuple[str, int]:
    shard.refresh_from_db()
    g = GPU.objects.get(uuid=shard.gpu_uuids[0])
    return g.node_id, g.index


def serving(model_fields=None, nodes=("gpu-01", "gpu-02")):
    for n in nodes:
        add_node(n)
    model = add_model(**(model_fields or {}))
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    return model, clock


def test_an_xid_79_fails_the_gpu_and_its_replica_moves_with_its_replacement_first():
    model, clock = serving()
    [old] = running(model)
    node_id, index = gpu_of(old)

    events(node_id, (index, "xid", 79))

    g = gpu(node_id, index)
    assert (g.health, g.health_reason) == ("failed", "XID 79: GPU has fallen off the bus")
    assert g.xids == {"79": 1}
    clock.pass_()
    new = [s for s in running(model) if s.pk != old.pk]
    assert len(new) == 1 and gpu_of(new[0]) != (node_id, index)
    assert desired(node_id)[old.pk] == "running"  # still serving while its replacement starts
    report(new[0], "ready")
    clock.pass_()
    assert desired(node_id)[old.pk] == "draining"
    reasons = list(Event.objects.filter(kind=EventKind.GPU).values_list("reason", flat=True))
    assert any("XID 79" in r and "replacements first" in r for r in reasons), reasons


def test_a_failed_gpu_stays_out_of_placement_until_an_operator_clears_it():
    model, clock = serving(nodes=("gpu-01",))
    [old] = running(model)
    node_id, index = gpu_of(old)
    events(node_id, (index, "xid", 48))
    clock.pass_()
    [new] = [s for s in running(model) if s.pk != old.pk]
    assert gpu_of(new) != (node_id, index)

    # the agent restarts (a new registration rewrites the GPU rows): still failed
    add_node(node_id)
    assert gpu(node_id, index).health == "failed"

    with pytest.raises(ValueError, match="say why the GPU is fine again"):
        gpu_health.clear(gpu(node_id, index), permissions.SYSTEM, "  ")
    viewer = grant(staff_user("viewer"), "fleet.view_node", "fleet.view_gpu")
    with pytest.raises(permissions.Refused, match="fleet.drain_node"):
        gpu_health.clear(gpu(node_id, index), viewer, "reset")
    assert gpu(node_id, index).health == "failed"

    changed, text = gpu_health.clear(gpu(node_id, index), permissions.SYSTEM, "GPU reset")
    assert changed and "GPU reset" in text
    g = gpu(node_id, index)
    assert (g.health, g.fault, g.drained_at) == ("healthy", "healthy", None)
    assert g.xids == {"48": 1}  # the count is history, not a fault


def test_a_contained_ecc_error_degrades_the_gpu_and_moves_what_ran_there():
    model, clock = serving()
    [old] = running(model)
    node_id, index = gpu_of(old)

    events(node_id, (index, "xid", 94))
    clock.pass_()

    g = gpu(node_id, index)
    assert (g.health, g.health_reason) == ("degraded", "XID 94: Contained ECC error")
    [new] = [s for s in running(model) if s.pk != old.pk]
    assert gpu_of(new) != (node_id, index)


def test_a_degraded_gpu_is_cordoned_and_what_runs_there_stays():
    model, clock = serving()
    [old] = running(model)
    node_id, index = gpu_of(old)

    events(node_id, slowdowns=[(index, ["HW Thermal Slowdown"])])
    clock.pass_()

    g = gpu(node_id, index)
    assert (g.health, g.health_reason) == ("degraded", "clocks slowed: HW Thermal Slowdown")
    assert [s.pk for s in running(model)] == [old.pk]
    # nothing new goes there: a second replica lands elsewhere
    model.desired_replicas = 2
    model.save()
    clock.pass_()
    [new] = [s for s in running(model) if s.pk != old.pk]
    assert gpu_of(new) != (node_id, index)


def test_a_slowdown_degrades_a_gpu_only_while_it_lasts():
    add_node("gpu-01")
    events("gpu-01", slowdowns=[(3, ["HW Slowdown"])])
    assert (gpu("gpu-01", 3).health, gpu("gpu-01", 3).health_reason) == (
        "degraded",
        "clocks slowed: HW Slowdown",
    )
    events("gpu-01", slowdowns=[(3, [])])
    assert gpu("gpu-01", 3).health == "healthy"


def test_a_watched_xid_counts_and_changes_nothing():
    add_node("gpu-01")
    events("gpu-01", (2, "xid", 13), (2, "xid", 13), (2, "xid", 31))
    g = gpu("gpu-01", 2)
    assert g.health == "healthy" and g.xids == {"13": 2, "31": 1}


def test_a_burst_of_failures_drains_at_most_the_brakes_bound():
    # four nodes of eight GPUs, a replica on every GPU of three of them
    for n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04"):
        add_node(n)
    model = add_model(replicas=24)
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    busy = {}
    for s in running(model):
        busy[gpu_of(s)] = s
    # 40 % of the fleet's GPUs fail within the minute: 13 of 32 (a driver bug)
    failing = sorted(busy)[:13]
    for node_id, index in failing:
        events(node_id, (index, "xid", 79))
    clock.pass_()

    bound = 8  # LLMGW_GPU_FAILURE_BRAKE's default, 0.25 of 32
    drained = GPU.objects.filter(health="failed", drained_at__isnull=False).count()
    assert drained == bound
    status = FleetStatus.objects.get(pk=1)
    assert status.gpu_brake.startswith(f"13 of 32 GPUs faulted; at most {bound} are drained")
    moved = [k for k in failing if desired(k[0]).get(busy[k].pk) == "running"]
    assert len(moved) == 13  # nothing stopped yet: only replacements started
    replacements = len(running(model)) - 24
    assert replacements == bound

    # a pass later nothing more moves: the brake holds
    clock.pass_()
    assert GPU.objects.filter(drained_at__isnull=False).count() == bound
    assert len(running(model)) - 24 == bound

    # the operator drains one held GPU's node by hand, and clears the rest (the driver's
    # fault): the brake lifts
    held = list(GPU.objects.filter(health="failed", drained_at__isnull=True))
    by_hand = held[0].node_id
    drain.drain_node(Node.objects.get(pk=by_hand))
    for g in held:
        if g.node_id != by_hand:
            gpu_health.clear(g, permissions.SYSTEM, "driver bug, not the GPU")
    clock.pass_()
    assert FleetStatus.objects.get(pk=1).gpu_brake == ""


def test_a_notice_drains_the_node_replacements_first_and_all_before_its_deadline():
    model, clock = serving(model_fields={"replicas": 2})
    on_01 = [s for s in running(model) if s.node_id == "gpu-01"]
    assert on_01
    gpu_health.give_notice(Node.objects.get(pk="gpu-01"), 60, "aws", "spot: terminate")
    clock.pass_()
    node = Node.objects.get(pk="gpu-01")
    assert node.cordoned and node.draining and node.notice_source == "aws"
    assert all(desired("gpu-01")[s.pk] == "running" for s in on_01)  # replacements first
    news = [
        s for s in running(model) if s.node_id == "gpu-02" and s.pk not in {x.pk for x in on_01}
    ]
    assert len(news) == len(on_01)

    # the replacements never become ready; 30 s before the deadline they drain anyway
    clock.advance(31, alive=["gpu-01", "gpu-02"])
    assert all(desired("gpu-01")[s.pk] == "draining" for s in on_01)
    notice = Event.objects.filter(kind=EventKind.NOTICE).values_list("reason", flat=True)
    assert any("goes away in 60 s (aws: spot: terminate" in r for r in notice)


def test_an_earlier_notice_wins_and_a_later_one_changes_nothing():
    add_node("gpu-01")
    node = Node.objects.get(pk="gpu-01")
    gpu_health.give_notice(node, 120, "file")
    first = Node.objects.get(pk="gpu-01").notice_deadline
    assert "has notice already" in gpu_health.give_notice(node, 600, "file")
    assert Node.objects.get(pk="gpu-01").notice_deadline == first
    gpu_health.give_notice(node, 30, "aws")
    assert Node.objects.get(pk="gpu-01").notice_deadline < first
    with pytest.raises(ValueError, match="a notice is 0 to"):
        gpu_health.give_notice(node, -1, "file")


def test_gpu_health_fields_are_refused_from_an_unknown_gpu_without_harm():
    add_node("gpu-01")
    events("gpu-01", (40, "xid", 79))
    assert not GPU.objects.exclude(health=GPUHealth.HEALTHY).exists()
