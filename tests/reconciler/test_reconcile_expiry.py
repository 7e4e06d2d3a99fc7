"""Silent nodes: suspect, lost, replaced; outages, a mostly silent fleet, returning nodes,
adoption after a control-plane restart."""

from datetime import timedelta

import pytest

from agentd import protocol
from fleet.models import FleetStatus, Node, NodeState, ReplicaState, Shard
from fleet.services import inventory
from fleet.services.reconciler import expiry
from tests.factories import add_model, add_node, register_msg
from tests.reconciler.helpers import Clock, desired, make_ready, replicas, reregister, running

pytestmark = pytest.mark.django_db


def node_state(node_id):
    return Node.objects.get(pk=node_id).state


def test_silent_node_goes_suspect_then_lost_and_its_replica_is_replaced():
    for n in ("gpu-01", "gpu-02", "gpu-03"):
        add_node(n)
    model = add_model()
    clock = Clock()
    clock.pass_()
    [shard] = running(model)
    assert shard.node_id == "gpu-01"
    make_ready(model)
    clock.pass_()

    # gpu-01 goes silent; the others keep heartbeating
    clock.advance(50, alive=["gpu-02", "gpu-03"], step=10)
    assert node_state("gpu-01") == NodeState.SUSPECT
    assert running(model) == [shard]  # suspect: nothing replaced yet

    clock.advance(250, alive=["gpu-02", "gpu-03"], step=25)
    assert node_state("gpu-01") == NodeState.LOST
    [moved] = running(model)
    assert moved.node_id == "gpu-02"
    assert replicas(model)[0].state == ReplicaState.STARTING
    assert desired("gpu-01") == {shard.pk: "stopped"}  # kept until the node hears it


def test_a_model_can_be_replaced_sooner_than_the_fleet_default():
    for n in ("gpu-01", "gpu-02"):
        add_node(n)
    model = add_model()
    model.replace_after_s = 60
    model.save()
    clock = Clock()
    clock.pass_()

    clock.advance(70, alive=["gpu-02"], step=10)

    assert node_state("gpu-01") == NodeState.SUSPECT  # the node itself is not lost yet
    assert [s.node_id for s in running(model)] == ["gpu-02"]


def test_at_most_one_lost_node_is_replaced_every_ten_seconds():
    for n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05"):
        add_node(n)
    model = add_model(replicas=2, gpus_per_node=8, tp=8, engine="vllm", policy="spread")
    clock = Clock()
    clock.pass_()
    assert sorted(s.node_id for s in running(model)) == ["gpu-01", "gpu-02"]

    clock.advance(300, alive=["gpu-03", "gpu-04", "gpu-05"], step=25)
    on_new = sorted(s.node_id for s in running(model))
    assert len([n for n in on_new if n in ("gpu-01", "gpu-02")]) == 1  # one replaced so far

    clock.advance(10, alive=["gpu-03", "gpu-04", "gpu-05"], step=5)
    assert all(s.node_id not in ("gpu-01", "gpu-02") for s in running(model))


def test_half_the_fleet_silent_replaces_nothing_and_says_so():
    for n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04"):
        add_node(n)
    model = add_model(replicas=2, gpus_per_node=8, tp=8, engine="vllm", policy="spread")
    clock = Clock()
    clock.pass_()
    before = {s.pk for s in running(model)}

    # three of four go silent together: this control plane is probably the one cut off
    clock.advance(600, alive=["gpu-04"], step=25)

    status = FleetStatus.objects.get()
    assert status.replacement_paused
    assert status.message.startswith("3 of 4 nodes are silent")
    assert {s.pk for s in running(model)} == before
    assert {node_state(n) for n in ("gpu-01", "gpu-02", "gpu-03")} == {NodeState.SUSPECT}

    # they come back: nothing was disturbed, and replacement resumes
    clock.advance(5, alive=["gpu-01", "gpu-02", "gpu-03", "gpu-04"])
    status.refresh_from_db()
    assert not status.replacement_paused and status.message == ""


def test_the_last_nodes_back_from_a_mass_silence_get_a_full_grace_period():
    for n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05"):
        add_node(n)
    model = add_model(replicas=5, gpus_per_node=8, tp=8, engine="vllm", policy="spread")
    clock = Clock()
    clock.pass_()
    before = {s.pk for s in running(model)}
    assert len({s.node_id for s in running(model)}) == 5

    # three of five go silent past the replace deadline: the brake holds
    clock.advance(360, alive=["gpu-04", "gpu-05"], step=25)
    assert FleetStatus.objects.get().replacement_paused

    # when: two of them are heard again, gpu-01 a pass later than the others
    clock.advance(1, alive=["gpu-02", "gpu-03", "gpu-04", "gpu-05"], step=1)

    # then: the brake is off, but gpu-01, silent 361 s, is not replaced: every
    # node was given a full grace period when the fleet came back
    assert not FleetStatus.objects.get().replacement_paused
    assert {s.pk for s in running(model)} == before
    clock.advance(1, alive=["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05"], step=1)
    assert {node_state(n) for n in ("gpu-01", "gpu-02", "gpu-03")} == {NodeState.READY}
    assert {s.pk for s in running(model)} == before

    # and a node that stays silent is replaced a full deadline after the return
    clock.advance(295, alive=["gpu-02", "gpu-03", "gpu-04", "gpu-05"], step=25)
    assert {s.pk for s in running(model)} == before
    clock.advance(10, alive=["gpu-02", "gpu-03", "gpu-04", "gpu-05"], step=5)
    assert node_state("gpu-01") == NodeState.LOST
    assert {s.pk for s in running(model)} != before


def test_after_an_outage_every_node_gets_a_full_grace_period():
    for n in ("gpu-01", "gpu-02", "gpu-03"):
        add_node(n)
    model = add_model()
    clock = Clock()
    clock.pass_()
    shards = {s.pk for s in running(model)}

    # no pass for ten minutes (the control plane, its database or Redis down);
    # the agents could not be heard either
    clock.now += timedelta(minutes=10)
    clock.pass_()

    assert {node_state(n) for n in ("gpu-01", "gpu-02", "gpu-03")} == {NodeState.READY}
    clock.advance(45, alive=["gpu-02", "gpu-03"], step=15)
    assert node_state("gpu-01") == NodeState.READY  # 45 s since the outage ended
    clock.advance(10, alive=["gpu-02", "gpu-03"], step=10)
    assert node_state("gpu-01") == NodeState.SUSPECT
    assert {s.pk for s in running(model)} == shards


def test_a_lost_node_that_returns_has_its_duplicates_stopped():
    for n in ("gpu-01", "gpu-02", "gpu-03"):
        add_node(n)
    model = add_model()
    clock = Clock()
    clock.pass_()
    [old] = running(model)
    make_ready(model)
    clock.pass_()
    clock.advance(300, alive=["gpu-02", "gpu-03"], step=25)
    [new] = running(model)
    assert new.node_id != "gpu-01"

    # gpu-01 comes back, still running the old engine
    reregister(
        "gpu-01",
        clock.now,
        running_shards=[{"shard_id": old.pk, "replica_id": old.replica_id, "state": "ready"}],
    )
    result = clock.pass_()

    assert node_state("gpu-01") == NodeState.READY
    assert desired("gpu-01") == {old.pk: "stopped"}
    assert result.unclaimed == 1
    assert running(model) == [new]  # one replica, on the node that took over


def test_a_shard_nothing_claims_is_reported_and_left_out_of_the_set():
    add_node("gpu-01")
    clock = Clock()
    clock.pass_()
    msg = register_msg("gpu-01", running_shards=[{"shard_id": "stray01", "state": "ready"}])

    inventory.register_node(protocol.Register.model_validate(msg))
    result = clock.pass_()

    assert result.unclaimed == 1
    assert "gpu-01" in result.nodes_notified
    assert desired("gpu-01") == {}


def test_after_a_control_plane_restart_running_shards_are_adopted_not_placed_again():
    for n in ("gpu-01", "gpu-02"):
        add_node(n)
    model = add_model(replicas=2, policy="spread")
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    before = {s.pk: s.node_id for s in running(model)}

    # the control plane is down for two minutes; then the agents re-register
    # with what they run, and the first pass comes
    clock.now += timedelta(minutes=2)
    Node.objects.update(connected=False)
    for node_id in ("gpu-01", "gpu-02"):
        mine = [{"shard_id": pk, "state": "ready"} for pk, n in before.items() if n == node_id]
        reregister(node_id, clock.now, running_shards=mine)
    result = clock.pass_()

    assert result.adopted == 2 and result.placed == 0 and result.unclaimed == 0
    assert {s.pk: s.node_id for s in running(model)} == before
    assert Shard.objects.count() == 2
    assert {r.state for r in replicas(model)} == {ReplicaState.READY}


def test_a_shard_whose_node_was_deleted_is_healed_by_placing_again():
    for n in ("gpu-01", "gpu-02"):
        add_node(n)
    model = add_model()
    clock = Clock()
    clock.pass_()
    [shard] = running(model)

    Node.objects.filter(pk=shard.node_id).delete()  # an operator removes it
    clock.pass_()

    [again] = running(model)
    assert again.node_id not in (None, shard.node_id)
    assert replicas(model)[0].state == ReplicaState.STARTING


def test_a_web_process_taking_agents_again_gives_every_node_a_full_grace_period():
    # given: three nodes, passes running; the web process goes away and comes
    # back within the outage gap, so the passes alone see no outage
    for n in ("gpu-01", "gpu-02", "gpu-03"):
        add_node(n)
    clock = Clock()
    clock.pass_()
    clock.advance(20, step=5)  # nobody heard: the agents' socket was gone

    # when: the new web process takes its first registration
    assert expiry.grace_from_now(clock.now)

    # then: a node still on its way back is ready until 50 s after that, not after
    # its last heartbeat (70 s by then), and suspect only past the full period
    clock.advance(45, alive=["gpu-02", "gpu-03"], step=15)
    assert node_state("gpu-01") == NodeState.READY
    clock.advance(10, alive=["gpu-02", "gpu-03"], step=10)
    assert node_state("gpu-01") == NodeState.SUSPECT
    # and an earlier moment never shortens a grace period already given
    assert not expiry.grace_from_now(clock.now - timedelta(minutes=5))


def _restart(clock, nodes, down_s=20):
    """Three nodes heard from, then the whole control plane away for ``down_s``."""
    for n in nodes:
        add_node(n)
    clock.pass_()
    clock.advance(down_s, step=5)  # the passes' own gap is shorter than an outage


def test_a_fleet_coming_back_slowly_after_a_restart_has_no_node_suspect():
    # given: the control plane restarted; its fleet comes back over 85 s (backoffs,
    # then a queue of registrations), longer than the 50 s grace from the first one
    nodes = ("gpu-01", "gpu-02", "gpu-03")
    clock = Clock()
    _restart(clock, nodes)
    rejoin = expiry.Rejoin()

    back = []
    for node_id in nodes:
        # then: no node on its way back is suspect, however late after the first
        assert node_state(node_id) == NodeState.READY
        reregister(node_id, clock.now)
        rejoin.registered(clock.now)
        back.append(node_id)
        if len(back) < len(nodes):
            # the queue: other agents of the fleet register every 10 s meanwhile
            for _ in range(4):
                clock.advance(10, alive=back, step=5)
                rejoin.registered(clock.now)
    clock.advance(60, alive=back, step=5)

    assert {node_state(n) for n in nodes} == {NodeState.READY}
    assert rejoin.over  # every node is back: the wave is over
    assert not FleetStatus.objects.get().replacement_paused


def test_a_node_failing_once_the_fleet_is_back_is_suspect_on_time():
    # given: the fleet came back after a restart, every node registered
    nodes = ("gpu-01", "gpu-02", "gpu-03")
    clock = Clock()
    _restart(clock, nodes)
    rejoin = expiry.Rejoin()
    for node_id in nodes:
        reregister(node_id, clock.now)
        rejoin.registered(clock.now)
        clock.advance(2, alive=nodes, step=2)
    assert rejoin.over
    failed_at = clock.now

    # when: gpu-03 fails, while another node reconnects now and then
    for _ in range(4):
        clock.advance(10, alive=["gpu-01", "gpu-02"], step=5)
        reregister("gpu-01", clock.now)
        assert not rejoin.registered(clock.now)  # the grace period stays where it was

    # then: it is suspect 50 s after its last heartbeat, as without a restart
    clock.advance(45 - (clock.now - failed_at).total_seconds(), alive=["gpu-01", "gpu-02"])
    assert node_state("gpu-03") == NodeState.READY
    clock.advance(5, alive=["gpu-01", "gpu-02"])
    assert node_state("gpu-03") == NodeState.SUSPECT


def test_a_node_that_never_comes_back_ends_the_wave_after_a_backoff_of_quiet():
    # given: a restart after which two of three nodes come back; gpu-03 died meanwhile
    nodes = ("gpu-01", "gpu-02", "gpu-03")
    clock = Clock()
    _restart(clock, nodes)
    rejoin = expiry.Rejoin()
    for node_id in ("gpu-01", "gpu-02"):
        reregister(node_id, clock.now)
        rejoin.registered(clock.now)
        clock.advance(5, alive=["gpu-01", "gpu-02"])
    last = clock.now - timedelta(seconds=5)
    assert not rejoin.over  # gpu-03 may still be in its backoff

    # when: no registration for longer than agentd's backoff cap, then one (a flap)
    clock.advance(expiry.REJOIN_QUIET_S + 5, alive=["gpu-01", "gpu-02"])
    reregister("gpu-01", clock.now)
    assert not rejoin.registered(clock.now)
    assert rejoin.over

    # then: gpu-03 is suspect 50 s after the wave's last registration, not later
    clock.advance(45 - (clock.now - last).total_seconds(), alive=["gpu-01", "gpu-02"])
    assert node_state("gpu-03") == NodeState.READY
    clock.advance(5, alive=["gpu-01", "gpu-02"])
    assert node_state("gpu-03") == NodeState.SUSPECT
