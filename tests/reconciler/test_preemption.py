"""Priorities that make room: which replicas go (a pure table), and the passes that drain
them, place the replica of higher priority, and bring theirs back when room frees."""

from datetime import timedelta

import pytest

from fleet.models import Event, EventKind, Model, Replica, ReplicaState
from fleet.services.placement_types import NodeInfo
from fleet.services.preemption import Holder, choose_victims
from tests.factories import H100_GPUS, add_model, add_node
from tests.reconciler.helpers import (
    Clock,
    desired,
    heartbeat,
    make_ready,
    replicas,
    report,
    running,
)
from tests.reconciler.test_placement_shares import GB, card, share, snap, whole

# ---- choosing victims: tables ---------------------------------------------------------


def node_with(node_id, *cards, used=()):
    return NodeInfo(id=node_id, engines={"vllm": "0.11.0"}, gpus=list(cards), used_gpus=set(used))


def held(replica, prio, node="n1", gpus=("GPU-0",), gb=0, model=None):
    return Holder(replica, model or replica, prio, node, tuple(gpus), round(gb * GB))


def test_the_fewest_of_the_lowest_priority_make_room():
    # GPU 0 of 80 GB: 30 + 20 + 20 promised; a 40 GB share needs two of them gone
    # (79 - 70 = 9 free now)
    n1 = node_with("n1", card(0, promised=70 * GB))
    holders = [held("a", 10, gb=30), held("b", 5, gb=20), held("c", 1, gb=20)]

    room = choose_victims(snap(n1), share(40), 50, holders)

    # one alone is never enough; of the pairs that are, the lowest priorities
    assert [v.replica_id for v in room.victims] == ["c", "b"]
    assert room.node_id == "n1" and room.placement.shards[0].gpu_uuids == ("GPU-0",)


def test_one_big_replica_beats_two_small_ones_of_lower_priority():
    n1 = node_with("n1", card(0, promised=70 * GB))
    holders = [held("big", 20, gb=30), held("s1", 1, gb=20), held("s2", 2, gb=20)]

    room = choose_victims(snap(n1), share(30), 50, holders)

    assert [v.replica_id for v in room.victims] == ["big"]  # fewest first


@pytest.mark.parametrize("prio", [50, 60])
def test_equal_or_higher_priority_is_never_preempted(prio):
    n1 = node_with("n1", card(0, promised=70 * GB))

    assert choose_victims(snap(n1), share(40), 50, [held("a", prio, gb=70)]) is None


def test_a_whole_gpu_holder_gives_its_gpu_back():
    n1 = node_with("n1", card(0), card(1), used={"GPU-0", "GPU-1"})
    holders = [held("w0", 3, gpus=("GPU-0",)), held("w1", 1, gpus=("GPU-1",))]

    room = choose_victims(snap(n1), whole(1), 9, holders)

    assert [v.replica_id for v in room.victims] == ["w1"]
    assert room.placement.shards[0].gpu_uuids == ("GPU-1",)


def test_the_node_needing_fewer_victims_wins_and_others_rules_still_hold():
    n1 = node_with("n1", card(0, promised=60 * GB))
    n2 = node_with("n2", card(0, promised=60 * GB))
    n2.gpus[0].uuid = "GPU-n2"
    no_engine = node_with("n3", card(0, promised=75 * GB))
    no_engine.engines = {}
    no_engine.gpus[0].uuid = "GPU-n3"
    holders = [
        held("a1", 1, gb=30),
        held("a2", 1, gb=30),
        held("b1", 2, node="n2", gpus=("GPU-n2",), gb=60),
        held("c1", 0, node="n3", gpus=("GPU-n3",), gb=75),  # vllm is not on n3
    ]

    room = choose_victims(snap(n1, n2, no_engine), share(50), 9, holders)

    assert (room.node_id, [v.replica_id for v in room.victims]) == ("n2", ["b1"])


# ---- over passes ------------------------------------------------------------------------


def one_h100(node_id="gpu-01"):
    add_node(node_id, gpus=[{**H100_GPUS[0], "uuid": f"GPU-{node_id}-0"}])


def small(name, prio, gb=30, team=None):
    model = add_model(name, engine="vllm", gpus_per_node=1, tp=1, gpu_memory_gb=gb)
    Model.objects.filter(pk=model.pk).update(priority=prio, team=team)
    model.refresh_from_db()
    return model


def ready_low():
    """One H100 held by "low" (priority 1, 70 GB), ready; and the clock of its passes."""
    one_h100()
    low = small("low", 1, gb=70)
    clock = Clock()
    clock.pass_()
    make_ready(low)
    clock.pass_()
    return low, clock


@pytest.mark.django_db
def test_a_higher_priority_drains_a_lower_one_takes_its_place_and_gives_it_back():
    # given one H100 (79.6 GB) shared by two small models, both ready
    one_h100()
    low, mid = small("low", 10), small("mid", 20)
    clock = Clock()
    clock.pass_()
    make_ready(low)
    make_ready(mid)
    clock.pass_()
    # when a model of priority 90 asks for 45 GB
    big = small("big", 90, gb=45)
    report_ = clock.pass_()

    # then the lowest that makes room drains (not stops): its requests finish first
    assert report_.preempted == 1
    [drained] = replicas(low, state=ReplicaState.DRAINING)
    assert drained.reason == "preempted by big (priority 90)"
    assert set(desired("gpu-01").values()) == {"running", "draining"}
    [big_r] = replicas(big)
    assert big_r.state == ReplicaState.PENDING
    assert big_r.reason == "making room on gpu-01: preempting low (priority 10)"
    # and low keeps its count: a replica in its place waits, saying why
    [back] = replicas(low, state=ReplicaState.PENDING)
    assert back.preempted_by == "big (priority 90)"
    [event] = Event.objects.filter(kind=EventKind.PREEMPT)
    assert event.model_name == "low" and "to make room for big (priority 90)" in event.reason
    # and mid, of priority 20, is untouched; nothing more is preempted while low drains
    clock.pass_()
    assert replicas(mid)[0].state == ReplicaState.READY
    assert replicas(big)[0].reason == "making room: waiting for low to stop"
    assert Event.objects.filter(kind=EventKind.PREEMPT).count() == 1

    # when low's engine has stopped
    report(drained.shards.get(), "stopped")
    clock.pass_()

    # then big is placed on the GPU, and low waits for room
    assert [s.gpu_uuids for s in running(big)] == [["GPU-gpu-01-0"]]
    back.refresh_from_db()
    assert back.state == ReplicaState.PENDING
    assert back.reason.startswith("preempted by big (priority 90); no node fits")

    # when big scales down, low comes back
    make_ready(big)
    clock.pass_()
    Model.objects.filter(pk=big.pk).update(desired_replicas=0)
    clock.pass_()
    report(big_r.shards.get(), "stopped")
    clock.pass_()
    back.refresh_from_db()
    assert back.state == ReplicaState.STARTING and back.preempted_by == ""


@pytest.mark.django_db
def test_no_preemption_beyond_the_limit_a_minute_nor_under_the_brake(settings):
    settings.LLMGW = {**settings.LLMGW, "PREEMPTIONS_PER_MINUTE": 1}
    for n in ("gpu-01", "gpu-02"):
        one_h100(n)
    lows = [small(f"low{i}", 1, gb=70) for i in range(2)]
    clock = Clock()
    clock.pass_()
    for m in lows:
        make_ready(m)
    clock.pass_()

    bigs = [small(f"big{i}", 50, gb=70) for i in range(2)]
    clock.pass_()

    # one preemption in this minute; the other waits and says why
    assert Event.objects.filter(kind=EventKind.PREEMPT).count() == 1
    waiting = [r for m in bigs for r in replicas(m) if "a minute" in r.reason]
    assert len(waiting) == 1
    assert "LLMGW_PREEMPTIONS_PER_MINUTE" in waiting[0].reason
    # a minute later the second goes
    clock.now += timedelta(seconds=61)
    clock.pass_()
    assert Event.objects.filter(kind=EventKind.PREEMPT).count() == 2


@pytest.mark.django_db
def test_the_mass_failure_brake_stops_preemption():
    from fleet.models import FleetStatus

    low, clock = ready_low()
    # more than half the fleet silent: replacement, and so preemption, is paused
    for i in range(3):
        add_node(f"gone-{i}", gpus=[])
    heartbeat(*(f"gone-{i}" for i in range(3)), "gpu-01", at=clock.now)
    clock.advance(600, alive=["gpu-01"], step=25)
    small("big", 50, gb=70)
    report_ = clock.pass_()

    assert report_.paused and report_.preempted == 0
    assert FleetStatus.objects.get().replacement_paused
    assert not Event.objects.filter(kind=EventKind.PREEMPT).exists()
    assert replicas(low)[0].state == ReplicaState.READY
    assert Replica.objects.exclude(preempted_by="").count() == 0


@pytest.mark.django_db
def test_a_replica_scaled_down_in_the_same_pass_is_not_preempted_again():
    low, clock = ready_low()
    # when low is scaled to zero as a higher priority arrives, in one pass
    Model.objects.filter(pk=low.pk).update(desired_replicas=0)
    small("big", 50, gb=70)
    report_ = clock.pass_()

    # then low drains for its scale-down only: no event, no replica waiting in its place
    assert report_.preempted == 0
    assert not Event.objects.filter(kind=EventKind.PREEMPT).exists()
    assert [r.state for r in replicas(low)] == [ReplicaState.DRAINING]
    assert replicas(low)[0].reason == "scaled down to 0"


# ---- teams: only what another team borrowed is taken back -----------------------------


def of_team(h: Holder, team_id, gb) -> Holder:
    return Holder(
        h.replica_id, h.model, h.priority, h.node_id, h.gpu_uuids, h.share_mb, team_id, gb * GB
    )


def test_another_teams_replicas_are_taken_only_while_it_borrows():
    # GPU 0 of 80 GB: team 2's 30 GB share and the fleet's 40 GB share on it
    n1 = node_with("n1", card(0, promised=70 * GB))
    theirs = of_team(held("theirs", 1, gb=30), 2, 30)
    fleets = of_team(held("fleets", 5, gb=40), None, 40)

    # team 2 within its guarantee: team 1's replica takes the fleet's, though of
    # higher priority than team 2's
    room = choose_victims(snap(n1), share(30), 50, [theirs, fleets], team_id=1, borrowed={})
    assert [v.replica_id for v in room.victims] == ["fleets"]

    # team 2 borrowing: its replica of lowest priority goes first
    room = choose_victims(
        snap(n1), share(30), 50, [theirs, fleets], team_id=1, borrowed={2: 10 * GB}
    )
    assert [v.replica_id for v in room.victims] == ["theirs"]

    # one's own team's replicas are always one's own to take
    room = choose_victims(snap(n1), share(30), 50, [of_team(theirs, 1, 30)], team_id=1)
    assert [v.replica_id for v in room.victims] == ["theirs"]


def test_no_more_is_taken_back_than_a_team_borrowed():
    # GPU 0 of 80 GB: team 2's three 18 GB shares and the fleet's 20 GB (74 promised)
    n1 = node_with("n1", card(0, promised=74 * GB))
    holders = [of_team(held(f"t{i}", 1, gb=18), 2, 18) for i in range(3)]
    holders.append(of_team(held("f", 9, gb=20), None, 20))

    # a 40 GB share needs two of them gone. Team 2 borrowing 10 GB gives back one
    # (it is down to its guarantee once that one is gone): the fleet's goes with it
    room = choose_victims(snap(n1), share(40), 50, holders, team_id=1, borrowed={2: 10 * GB})
    assert sorted(v.replica_id for v in room.victims) == ["f", "t0"]

    # borrowing 25 GB, two of team 2's may go: the first while it is still above
    room = choose_victims(snap(n1), share(40), 50, holders, team_id=1, borrowed={2: 25 * GB})
    assert sorted(v.replica_id for v in room.victims) == ["t0", "t1"]


def teams_fleet(guaranteed_gb):
    """One H100; team "b" (guaranteed ``guaranteed_gb``) holds it with a 70 GB share of
    priority 1, ready; team "a" may set priorities up to 90."""
    from tests.api.test_teams import team

    a, b = team("a", max_priority=90), team("b", guaranteed_gpu_memory_gb=guaranteed_gb)
    one_h100()
    low = small("low", 1, gb=70, team=b)
    clock = Clock()
    clock.pass_()
    make_ready(low)
    clock.pass_()
    return a, low, clock


@pytest.mark.django_db
def test_a_team_within_its_guarantee_keeps_its_replica_against_another_teams_priority():
    a, low, clock = teams_fleet(guaranteed_gb=80)
    high = small("high", 90, gb=40, team=a)

    passed = clock.pass_()

    assert passed.preempted == 0
    assert replicas(low)[0].state == ReplicaState.READY
    assert replicas(high)[0].state == ReplicaState.PENDING
    assert not Event.objects.filter(kind=EventKind.PREEMPT).exists()


@pytest.mark.django_db
def test_a_team_above_its_guarantee_gives_back_what_it_borrowed_and_the_event_says_so():
    a, low, clock = teams_fleet(guaranteed_gb=20)
    small("high", 90, gb=40, team=a)

    passed = clock.pass_()

    assert passed.preempted == 1
    [drained] = replicas(low, state=ReplicaState.DRAINING)
    assert drained.reason == "preempted by high (priority 90)"
    [event] = Event.objects.filter(kind=EventKind.PREEMPT)
    assert event.reason.endswith(
        "to make room for high (priority 90): team 'b' holds 70 GB of GPU memory, above "
        "its guaranteed 20 GB"
    ), event.reason


@pytest.mark.django_db
def test_what_a_team_gives_back_while_draining_counts_against_what_it_borrowed():
    # given: team b holds two 35 GB shares of one H100, 35 GB above its guarantee of 35
    from tests.api.test_teams import team

    a, b = team("a", max_priority=90), team("b", guaranteed_gpu_memory_gb=35)
    one_h100()
    lows = [small(f"low{i}", 1, gb=35, team=b) for i in range(2)]
    clock = Clock()
    clock.pass_()
    for m in lows:
        make_ready(m)
    clock.pass_()

    # when: team a asks for 40 GB twice, one model after the other
    small("high", 90, gb=40, team=a)
    assert clock.pass_().preempted == 1
    high2 = small("high2", 90, gb=40, team=a)

    # then: while b's first replica drains, b is down to its guarantee: its other
    # replica stays, and high2 waits
    for _ in range(2):
        assert clock.pass_().preempted == 0
    assert Event.objects.filter(kind=EventKind.PREEMPT).count() == 1
    assert sorted(r.state for m in lows for r in replicas(m)) == [
        ReplicaState.DRAINING,
        ReplicaState.PENDING,
        ReplicaState.READY,
    ]
    assert replicas(high2)[0].state == ReplicaState.PENDING
