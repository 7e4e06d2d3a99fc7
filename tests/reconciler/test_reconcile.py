"""Reconciler scenarios on the database: placing, restarting, scaling, rolling replacement.

Time is passed in as ``now``; nothing sleeps.
"""

from datetime import timedelta

import pytest

from fleet.models import FleetStatus, Replica, ReplicaState
from fleet.services.desired import desired_set
from tests.factories import add_model, add_node
from tests.reconciler.helpers import (
    Clock,
    desired,
    make_ready,
    replicas,
    report,
    running,
    shards_of,
)

pytestmark = pytest.mark.django_db


def test_a_new_model_is_placed_and_its_node_told():
    node = add_node("gpu-01")
    model = add_model(replicas=2, gpus_per_node=4, tp=4, engine="vllm")
    clock = Clock()

    result = clock.pass_()

    shards = running(model)
    assert result.placed == 2
    assert [s.node_id for s in shards] == ["gpu-01", "gpu-01"]
    assert len(set(shards[0].gpu_uuids) | set(shards[1].gpu_uuids)) == 8
    assert shards[0].port != shards[1].port
    node.refresh_from_db()
    assert node.desired_version == 1
    assert desired("gpu-01") == {s.pk: "running" for s in shards}
    assert {r.state for r in replicas(model)} == {ReplicaState.STARTING}


def test_a_second_pass_changes_nothing():
    add_node("gpu-01")
    model = add_model(replicas=2)
    clock = Clock()
    clock.pass_()
    before = [(s.pk, s.node_id, s.port) for s in running(model)]

    again = clock.pass_()

    assert not again.changed()
    assert again.nodes_notified == []
    assert [(s.pk, s.node_id, s.port) for s in running(model)] == before


def test_ready_when_every_shard_is_ready():
    add_node("gpu-01")
    model = add_model()
    clock = Clock()
    clock.pass_()

    make_ready(model)
    clock.pass_()

    assert replicas(model)[0].state == ReplicaState.READY


def test_unplaceable_replica_stays_pending_with_the_reason():
    add_node("gpu-07", memory_gb=8)
    model = add_model(min_memory_gb=24)

    Clock().pass_()

    [replica] = replicas(model)
    assert replica.state == ReplicaState.PENDING
    assert replica.reason == "no node fits: gpu-07: has 8 GB of memory, needs 24"
    assert shards_of(model) == []


def test_pending_replica_is_placed_once_a_node_fits():
    add_node("gpu-07", memory_gb=8)
    model = add_model(min_memory_gb=24)
    clock = Clock()
    clock.pass_()

    add_node("gpu-08", memory_gb=64)
    clock.advance(5, alive=["gpu-07", "gpu-08"])

    assert [s.node_id for s in running(model)] == ["gpu-08"]


def test_failed_shard_restarts_after_a_doubling_backoff():
    add_node("gpu-01")
    model = add_model()
    clock = Clock()
    clock.pass_()
    [first] = running(model)

    # when the engine dies
    report(first, "failed", error="engine exited", exit_code=137)
    clock.pass_()

    [replica] = replicas(model)
    assert replica.state == ReplicaState.FAILED
    assert replica.reason == "shard on gpu-01 failed: engine exited; restart in 10 s"
    assert running(model) == []
    assert desired("gpu-01") == {}  # failed and stopped: gone from the set

    clock.advance(5, alive=["gpu-01"])
    assert running(model) == []  # still backing off
    clock.advance(5, alive=["gpu-01"])
    [second] = running(model)
    assert second.pk != first.pk and second.node_id == "gpu-01"

    report(second, "failed", error="engine exited")
    clock.pass_()
    assert "restart in 20 s" in replicas(model)[0].reason
    clock.advance(15, alive=["gpu-01"])
    assert running(model) == []
    clock.advance(5, alive=["gpu-01"])
    assert len(running(model)) == 1


def test_restarts_are_counted_on_the_replica_and_outlive_a_recovery():
    # given a replica whose engine failed twice, then came up
    add_node("gpu-01")
    model = add_model()
    clock = Clock()
    clock.pass_()
    for _ in range(2):
        report(running(model)[0], "failed", error="engine exited")
        clock.pass_()
        clock.advance(20, alive=["gpu-01"])
    make_ready(model)
    clock.pass_()

    # then operators see two restarts, while the failure streak is over
    [replica] = replicas(model)
    assert (replica.state, replica.restarts, replica.failures) == (ReplicaState.READY, 2, 0)


def test_backoff_is_capped_and_reset_when_ready():
    from fleet.services.reconciler.passes import backoff_s

    assert [backoff_s(n) for n in (1, 2, 3, 5, 6, 10)] == [10, 20, 40, 160, 300, 300]

    add_node("gpu-01")
    model = add_model()
    clock = Clock()
    clock.pass_()
    report(running(model)[0], "failed")
    clock.pass_()
    clock.advance(10, alive=["gpu-01"])
    make_ready(model)
    clock.pass_()

    replica = replicas(model)[0]
    assert (replica.state, replica.failures, replica.retry_at) == (ReplicaState.READY, 0, None)


def test_repeated_failures_on_one_node_move_the_replica():
    add_node("gpu-01")
    add_node("gpu-02")
    model = add_model()
    clock = Clock()
    clock.pass_()
    assert running(model)[0].node_id == "gpu-01"

    for _ in range(3):
        [shard] = running(model)
        assert shard.node_id == "gpu-01"
        report(shard, "failed", error="CUDA error: an illegal memory access")
        clock.advance(200, alive=["gpu-01", "gpu-02"])

    [shard] = running(model)
    assert shard.node_id == "gpu-02"
    assert replicas(model)[0].node_failures == {"gpu-01": 3}


def test_a_start_that_outlives_its_timeout_fails():
    add_node("gpu-01")
    model = add_model(startup_timeout_s=60)
    clock = Clock()
    clock.pass_()
    [shard] = running(model)
    report(shard, "loading")

    clock.advance(65, alive=["gpu-01"])

    [replica] = replicas(model)
    assert replica.state == ReplicaState.FAILED
    assert "not ready within 60 s (was loading)" in replica.reason


def test_a_fetch_that_makes_progress_is_not_a_hung_start():
    from agentd import protocol
    from fleet.services import inventory

    add_node("gpu-01")
    model = add_model(startup_timeout_s=60)
    clock = Clock()
    clock.pass_()
    [shard] = running(model)
    report(shard, "starting")

    for _ in range(14):  # 70 s of a big download, progress every 5 s
        clock.advance(5, alive=["gpu-01"])
        inventory.apply_fetch_progress(
            "gpu-01",
            protocol.FetchProgress(type="fetch_progress", shard_id=shard.pk, bytes_done=1),
        )
        type(shard).objects.filter(pk=shard.pk).update(fetch_updated_at=clock.now)

    assert replicas(model)[0].state == ReplicaState.STARTING


def test_multi_node_replica_restarts_as_a_group():
    for n in ("gpu-01", "gpu-02"):
        add_node(n)
    model = add_model(engine="vllm", gpus_per_node=8, nodes=2, tp=8, pp=2)
    clock = Clock()
    clock.pass_()
    group = running(model)
    assert sorted(s.node_id for s in group) == ["gpu-01", "gpu-02"]
    assert [s.rank for s in group] == [0, 1]
    assert all(s.hcas == ["mlx5_0", "mlx5_1"] for s in group)
    make_ready(model)
    clock.pass_()

    leader = desired_set(group[0].node_id).shards[0]
    follower = desired_set(group[1].node_id).shards[0]
    assert leader.leader_addr == follower.leader_addr == "10.0.0.7"  # rank 0's mgmt address
    assert follower.leader_port == leader.leader_port not in (0, group[0].port)

    report(group[1], "failed", error="NCCL timeout")
    clock.pass_()

    assert running(model) == []  # the healthy rank is stopped too
    assert desired(group[0].node_id)[group[0].pk] == "stopped"
    for s in group:
        report(s, "stopped") if s is group[0] else None
    clock.advance(10, alive=["gpu-01", "gpu-02"])
    fresh = running(model)
    assert len(fresh) == 2 and not {s.pk for s in fresh} & {s.pk for s in group}


def test_a_two_node_placement_tells_each_rank_its_interface_and_the_fabric():
    add_node("gpu-01", mgmt_addr="10.0.0.7", mgmt_interface="eno1")
    add_node("gpu-02", mgmt_addr="10.0.0.8", mgmt_interface="bond0")
    model = add_model(engine="vllm", gpus_per_node=8, nodes=2, tp=8, pp=2)
    single = add_model(name="small", engine="vllm", gpus_per_node=0)
    Clock().pass_()
    group = running(model)

    by_node = {s.node_id: desired_set(s.node_id) for s in group}
    mine = {
        node: next(d for d in ds.shards if d.replica_id == group[0].replica_id)
        for node, ds in by_node.items()
    }
    assert mine["gpu-01"].mgmt_interface == "eno1" and mine["gpu-02"].mgmt_interface == "bond0"
    assert {d.fabric for d in mine.values()} == {"ib0"}
    # one node needs neither: its engine's spec, and so the engine, stays as it was
    [alone] = running(single)
    [entry] = [d for d in desired_set(alone.node_id).shards if d.shard_id == alone.pk]
    assert (entry.mgmt_interface, entry.fabric) == ("", "")

    # an interface reported again later changes no running shard's spec
    add_node("gpu-02", mgmt_addr="10.0.0.8", mgmt_interface="eno2")
    again = next(d for d in desired_set("gpu-02").shards if d.replica_id == group[0].replica_id)
    assert again.mgmt_interface == "bond0"


def test_scale_down_removes_the_least_useful_first():
    add_node("gpu-01")
    model = add_model(replicas=3, gpus_per_node=2, tp=2)
    clock = Clock()
    clock.pass_()
    a, b, c = running(model)
    report(a, "ready")
    report(b, "loading")
    clock.pass_()
    model.desired_replicas = 2
    model.save()

    clock.pass_()

    states = {r.pk: r.state for r in replicas(model)}
    assert states[c.replica_id] == ReplicaState.STOPPED  # starting, newest
    assert states[a.replica_id] == ReplicaState.READY

    model.desired_replicas = 1
    model.save()
    clock.pass_()
    states = {r.pk: r.state for r in replicas(model)}
    assert states[b.replica_id] == ReplicaState.STOPPED  # loading goes before ready
    assert states[a.replica_id] == ReplicaState.READY


def test_scaling_to_zero_drains_ready_replicas_then_stops_them():
    add_node("gpu-01")
    model = add_model()
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    model.desired_replicas = 0
    model.save()

    clock.pass_()

    [shard] = shards_of(model)
    assert desired("gpu-01") == {shard.pk: "draining"}
    report(shard, "stopped")
    clock.pass_()
    assert desired("gpu-01") == {}
    assert Replica.objects.filter(model=model).exclude(state=ReplicaState.STOPPED).count() == 0


def test_a_profile_change_is_a_rolling_replacement():
    from fleet.models import EngineProfile

    add_node("gpu-01")
    model = add_model(replicas=2, gpus_per_node=2, tp=2)
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    old = {r.pk for r in replicas(model)}
    new_profile = EngineProfile.objects.create(
        model=model, name="v2", engine="fake", model_path="/models/qwen", gpus_per_node=2, tp=2
    )
    model.active_profile = new_profile
    model.save()

    clock.pass_()

    fresh = [r for r in replicas(model) if r.pk not in old]
    assert len(fresh) == 1  # one at a time
    assert all(r.state == ReplicaState.READY for r in replicas(model) if r.pk in old)

    make_ready(model)
    clock.pass_()  # the first new one is ready: one old one drains, the next new one starts
    states = sorted(r.state for r in replicas(model) if r.pk in old)
    assert states == [ReplicaState.DRAINING, ReplicaState.READY]
    assert len([r for r in replicas(model) if r.pk not in old]) == 2

    make_ready(model)
    clock.pass_()
    clock.advance(60, alive=["gpu-01"])  # drains time out
    live = Replica.objects.filter(model=model).exclude(state=ReplicaState.STOPPED)
    assert {r.profile_id for r in live} == {new_profile.pk}
    assert live.count() == 2


def test_pass_records_its_time_in_fleet_status():
    add_node("gpu-01")
    clock = Clock()

    clock.pass_()
    clock.advance(5, alive=["gpu-01"])

    status = FleetStatus.objects.get()
    assert status.passes == 2
    assert status.last_pass_at == clock.now
    assert status.last_pass_ms is not None and not status.replacement_paused


def test_nothing_is_restarted_before_its_retry_time_even_across_passes():
    add_node("gpu-01")
    model = add_model()
    clock = Clock()
    clock.pass_()
    report(running(model)[0], "failed")
    clock.pass_()
    retry_at = replicas(model)[0].retry_at

    assert retry_at == clock.now + timedelta(seconds=10)
    for _ in range(3):
        clock.pass_()
    assert running(model) == []


def test_editing_the_active_profile_rolls_its_replicas():
    add_node("gpu-01")
    model = add_model(gpus_per_node=2, tp=2)
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    [old] = replicas(model)

    [old_shard] = running(model)
    profile = model.active_profile
    profile.args = ["--max-model-len", "8192"]
    profile.save()
    clock.pass_()

    # the running engine keeps the spec it was started with, so its agent
    # does not restart it; the new replica gets the new one
    sets = desired_set("gpu-01").shards
    by_id = {s.shard_id: s for s in sets}
    assert by_id[old_shard.pk].profile.args == []
    assert [s.profile.args for s in sets if s.shard_id != old_shard.pk] == [
        ["--max-model-len", "8192"]
    ]
    assert {r.pk: r.state for r in replicas(model)}[old.pk] == ReplicaState.READY
    make_ready(model)
    clock.pass_()
    assert {r.pk: r.state for r in replicas(model)}[old.pk] == ReplicaState.DRAINING


def test_a_change_that_does_not_touch_the_engine_rolls_nothing():
    add_node("gpu-01")
    model = add_model()
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()

    profile = model.active_profile
    profile.startup_timeout_s = 600
    profile.save()
    result = clock.pass_()

    assert not result.changed()


def test_models_with_a_share_of_a_gpu_are_placed_together_and_counted_across_passes():
    from fleet.models import GPU

    # given a node of 8 H100s (81,559 MiB, 79.6 GB each) where another process uses 10 GB
    # of GPU 0, and three models asking for 30 GB of one GPU each
    add_node("gpu-01")
    GPU.objects.filter(node_id="gpu-01", index=0).update(memory_used_mb=10 * 1024)
    models = [
        add_model(f"m{i}", gpus_per_node=1, tp=1, engine="vllm", gpu_memory_gb=30) for i in range(3)
    ]
    clock = Clock()

    clock.pass_()

    # then the two that fit beside the other process share GPU 0 (79.6 - 1 - 10 = 68.6 GB),
    # and the third, which does not, takes the next GPU rather than a promise too many
    gpu0 = GPU.objects.get(node_id="gpu-01", index=0).uuid
    gpu1 = GPU.objects.get(node_id="gpu-01", index=1).uuid
    placed = [running(m)[0].gpu_uuids for m in models]
    assert placed == [[gpu0], [gpu0], [gpu1]]
    # and each engine is told its budget as a part of the GPU's 81,559 MiB, rounded
    # down (0.3767 would let it take 30,723 of its 30,720)
    told = {
        s.model: (s.gpu_memory_fraction, s.profile.gpu_memory_gb)
        for s in desired_set("gpu-01").shards
    }
    assert told == {f"m{i}": (0.3766, 30.0) for i in range(3)}
    # and a pass later counts what the shards hold: a whole-GPU model takes neither
    big = add_model("big", gpus_per_node=6, tp=6, engine="vllm")
    clock.pass_()
    assert not {gpu0, gpu1} & set(running(big)[0].gpu_uuids)
    assert len(running(big)[0].gpu_uuids) == 6
    # and a seventh whole GPU is not there: the reason says so
    seven = add_model("seven", gpus_per_node=7, tp=7, engine="vllm")
    clock.pass_()
    assert "has 0 free GPUs, needs 7" in replicas(seven)[0].reason
