"""Heartbeats, shard status and fetch progress, each with the seed's semantics.

A socket handles its messages in order, so a heartbeat's ack also says every
message sent before it has been applied.
"""

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import (
    GPU,
    EngineInstall,
    LocalWeights,
    Node,
    NodeLoad,
    NodeState,
    Shard,
    ShardLoad,
    ShardState,
    Storage,
)
from fleet.services.heartbeat import batching
from tests.consumer.helpers import db, enrol
from tests.factories import make_shard

pytestmark = pytest.mark.django_db(transaction=True)

LOAD = {
    "cpu_percent": 37.5,
    "cpu_count": 224,
    "load1": 81.2,
    "load5": 79.9,
    "load15": 77.0,
    "memory_used_bytes": 812 * 2**30,
    "memory_available_bytes": 1200 * 2**30,
}


def logged(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def storage_of(node_id):
    return sorted(Storage.objects.filter(node_id=node_id).values_list("path", "free_bytes"))


def weights_of(node_id):
    return sorted(LocalWeights.objects.filter(node_id=node_id).values_list("path", flat=True))


def gpus_of(node_id):
    return list(GPU.objects.filter(node_id=node_id).order_by("index"))


@pytest.fixture
async def agent():
    a = await enrol("gpu-01")
    yield a
    await a.close()


# ---- heartbeat -----------------------------------------------------------------


async def test_storage_is_replaced_each_time_it_is_sent(agent):
    assert await db(storage_of)("gpu-01") == [("/var/lib/llmgw", 10**12)]

    await agent.heartbeat(
        seq=1,
        storage=[
            {"path": "/var/lib/llmgw", "free_bytes": 4 * 10**11, "total_bytes": 2 * 10**12},
            {"path": "/models", "free_bytes": 9 * 10**12, "total_bytes": 10**13, "shared": True},
        ],
    )
    assert await db(storage_of)("gpu-01") == [
        ("/models", 9 * 10**12),
        ("/var/lib/llmgw", 4 * 10**11),
    ]

    # A heartbeat without storage is no news: what was there stays.
    await agent.heartbeat(seq=2)
    assert len(await db(storage_of)("gpu-01")) == 2

    # The node filling up is seen on the next heartbeat, not at the next restart.
    await agent.heartbeat(
        seq=3,
        storage=[{"path": "/var/lib/llmgw", "free_bytes": 10**9, "total_bytes": 2 * 10**12}],
    )
    assert await db(storage_of)("gpu-01") == [("/var/lib/llmgw", 10**9)]


async def test_weights_are_replaced_only_when_flagged_changed(agent):
    assert await db(weights_of)("gpu-01") == ["/models/qwen"]

    # An empty list without the flag is silence, not "this node holds nothing".
    await agent.heartbeat(seq=1, weights=[])
    assert await db(weights_of)("gpu-01") == ["/models/qwen"]
    # Nor does a list without the flag count.
    await agent.heartbeat(seq=2, weights=[{"path": "/models/other", "size_bytes": 1}])
    assert await db(weights_of)("gpu-01") == ["/models/qwen"]

    await agent.heartbeat(
        seq=3,
        weights_changed=True,
        weights=[
            {"path": "/models/qwen", "size_bytes": 15 * 10**9},
            {"path": "/models/llama-70b", "size_bytes": 140 * 10**9},
        ],
    )
    assert await db(weights_of)("gpu-01") == ["/models/llama-70b", "/models/qwen"]

    # With the flag, an empty list means the node holds nothing now.
    await agent.heartbeat(seq=4, weights_changed=True, weights=[])
    assert await db(weights_of)("gpu-01") == []


async def test_a_memory_change_is_applied_and_logged_once(agent, caplog):
    caplog.set_level(logging.INFO)
    for seq in (1, 2, 3):
        await agent.heartbeat(seq=seq, memory_total_mb=4127000)
    # No memory in a heartbeat is no news, not zero.
    await agent.heartbeat(seq=4)

    assert (await db(Node.objects.get)(pk="gpu-01")).memory_total_mb == 4127000
    lines = logged(caplog, "node memory changed")
    assert len(lines) == 1
    assert "from_mb=2063500 to_mb=4127000" in lines[0].getMessage()


async def test_an_engine_change_is_applied_and_logged_once(agent, caplog):
    caplog.set_level(logging.INFO)
    engines = {"llamacpp": "0.3.16", "vllm": "0.11.0"}
    await agent.heartbeat(seq=1, engines_changed=True, engine_versions=engines)
    await agent.heartbeat(seq=2, engines_changed=True, engine_versions=engines)
    # Without the flag the versions are not news, whatever they say.
    await agent.heartbeat(seq=3, engine_versions={})

    assert (await db(Node.objects.get)(pk="gpu-01")).engine_versions == engines
    lines = logged(caplog, "node engines changed")
    assert len(lines) == 1
    assert "to=['llamacpp', 'vllm']" in lines[0].getMessage()


async def test_engine_install_state_changes_are_logged_and_progress_is_not(agent, caplog):
    caplog.set_level(logging.INFO)

    def install(state, detail=""):
        return {"engine": "vllm", "version": "0.11.0", "variant": "cu128", "state": state,
                "detail": detail}  # fmt: skip

    await agent.heartbeat(seq=1, provision_changed=True, provision=[install("installing", "10%")])
    await agent.heartbeat(seq=2, provision_changed=True, provision=[install("installing", "60%")])
    await agent.heartbeat(
        seq=3, provision_changed=True, provision=[install("failed", "no space left on device")]
    )

    lines = logged(caplog, "engine installation node=gpu-01 engine=vllm")
    assert [(r.levelno, "state=failed" in r.getMessage()) for r in lines] == [
        (logging.INFO, False),
        (logging.WARNING, True),
    ]
    row = await db(EngineInstall.objects.get)(node_id="gpu-01", engine="vllm")
    assert row.state == "failed" and row.detail == "no space left on device"


async def test_load_is_stamped_with_its_arrival_time(agent):
    await db(make_shard)("gpu-01", shard_id="s1")
    before = timezone.now()
    await agent.heartbeat(
        seq=1,
        load={**LOAD, "shards": [{"shard_id": "s1", "cpu_cores": 3.5, "rss_bytes": 7 * 2**30}]},
    )
    after = timezone.now()

    load = await db(NodeLoad.objects.get)(node_id="gpu-01")
    assert before <= load.sampled_at <= after
    assert load.cpu_count == 224 and load.load1 == 81.2
    assert load.memory_used_bytes == 812 * 2**30
    shard = await db(ShardLoad.objects.get)(node_id="gpu-01")
    assert shard.shard_id == "s1" and shard.cpu_cores == 3.5 and shard.sampled_at == load.sampled_at

    # The next sample replaces it; a shard that stopped has no sample any more.
    await agent.heartbeat(seq=2, load={**LOAD, "cpu_percent": 2.0})
    load = await db(NodeLoad.objects.get)(node_id="gpu-01")
    assert load.cpu_percent == 2.0 and load.sampled_at > after
    assert await db(ShardLoad.objects.filter(node_id="gpu-01").count)() == 0


async def test_gpu_memory_used_is_updated_in_index_order(agent):
    used = [1024 * i for i in range(8)]
    await agent.heartbeat(seq=1, gpu_memory_used_mb=used)
    assert [g.memory_used_mb for g in await db(gpus_of)("gpu-01")] == used

    # A shorter list updates the first GPUs and leaves the rest.
    await agent.heartbeat(seq=2, gpu_memory_used_mb=[80000])
    assert [g.memory_used_mb for g in await db(gpus_of)("gpu-01")] == [80000, *used[1:]]


async def test_gpu_memory_given_back_asks_for_a_reconciler_pass_once_written(agent, monkeypatch):
    # A replica waiting to wake where an engine just went to sleep: the pass that
    # wakes it needs the memory written, and need not wait for beat's next one.
    asked = []
    monkeypatch.setattr(
        batching,
        "request_reconcile_now",
        lambda: asked.append([g.memory_used_mb for g in gpus_of("gpu-01")][:2]),
    )
    await agent.heartbeat(seq=1, gpu_memory_used_mb=[60000, 1000])
    await agent.heartbeat(seq=2, gpu_memory_used_mb=[60200, 1000])  # more in use
    await agent.heartbeat(seq=3, gpu_memory_used_mb=[59500, 1000])  # less, by noise
    await agent.heartbeat(seq=4)  # no GPU figures: no news
    assert asked == []

    # when: an engine gives its 50 GB back
    await agent.heartbeat(seq=5, gpu_memory_used_mb=[9500, 1000])
    # then: one pass asked for, after the room was written
    assert asked == [[9500, 1000]]


async def test_new_gpu_problems_are_attached_to_the_named_gpu(agent, caplog):
    problem = {"gpu_index": 5, "problem": "XID 79: GPU has fallen off the bus"}
    await agent.heartbeat(seq=1, new_problems=[problem])
    await agent.heartbeat(seq=2, new_problems=[problem])  # the same news twice
    await agent.heartbeat(seq=3, new_problems=[{"problem": "ECC page retirement pending"}])

    problems = {g.index: g.problems for g in await db(gpus_of)("gpu-01")}
    assert problems[5] == ["XID 79: GPU has fallen off the bus"]
    # Without an index the first GPU takes it: kept out of placement is the safe side.
    assert problems[0] == ["ECC page retirement pending"]
    assert all(problems[i] == [] for i in (1, 2, 3, 4, 6, 7))
    assert len(logged(caplog, "gpu problem node=gpu-01 gpu=5")) == 1


async def test_a_heartbeat_brings_a_suspect_node_back(agent, caplog):
    caplog.set_level(logging.INFO)
    old = timezone.now() - timedelta(minutes=2)
    await db(Node.objects.filter(pk="gpu-01").update)(state=NodeState.SUSPECT, last_seen=old)

    await agent.heartbeat(seq=1)

    node = await db(Node.objects.get)(pk="gpu-01")
    assert node.state == NodeState.READY and node.last_seen > old
    assert len(logged(caplog, "node back node=gpu-01 was=suspect")) == 1


# ---- shard status and fetch progress -------------------------------------------


async def test_a_shard_transition_is_stored_with_its_error_and_output(agent, caplog):
    shard = await db(make_shard)("gpu-01", state=ShardState.LOADING)
    await agent.send(
        {
            "type": "shard_status",
            "v": 1,
            "shard_id": shard.pk,
            "replica_id": shard.replica_id,
            "state": "failed",
            "error": "engine exited",
            "exit_code": 137,
            "last_output": ["loading weights", "CUDA out of memory"],
        }
    )
    await agent.heartbeat(seq=1)

    shard = await db(Shard.objects.get)(pk=shard.pk)
    assert shard.state == ShardState.FAILED and shard.exit_code == 137
    assert shard.error == "engine exited"
    assert shard.last_output == ["loading weights", "CUDA out of memory"]
    assert shard.state_changed_at is not None
    lines = logged(caplog, "shard failed node=gpu-01")
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR


async def test_an_unknown_shard_state_is_stored_as_failed_naming_it(agent, caplog):
    shard = await db(make_shard)("gpu-01", state=ShardState.STARTING)
    await agent.send({"type": "shard_status", "v": 1, "shard_id": shard.pk, "state": "hibernating"})
    await agent.heartbeat(seq=1)

    shard = await db(Shard.objects.get)(pk=shard.pk)
    assert shard.state == ShardState.FAILED
    assert "hibernating" in shard.error
    assert len(logged(caplog, "unknown shard state taken as failed")) == 1


async def test_a_status_for_another_nodes_shard_is_ignored(agent, caplog):
    await db(Node.objects.create)(id="gpu-02")
    theirs = await db(make_shard)("gpu-02", state=ShardState.READY)
    before = await db(Shard.objects.values().get)(pk=theirs.pk)

    await agent.send(
        {"type": "shard_status", "v": 1, "shard_id": theirs.pk, "state": "stopped", "error": "x"}
    )
    await agent.send({"type": "fetch_progress", "v": 1, "shard_id": theirs.pk, "bytes_done": 1})
    await agent.heartbeat(seq=1)

    assert await db(Shard.objects.values().get)(pk=theirs.pk) == before
    assert len(logged(caplog, "status for a shard this node does not hold")) == 1


async def test_fetch_progress_is_progress_and_never_a_transition(agent):
    started = timezone.now() - timedelta(minutes=20)
    shard = await db(make_shard)("gpu-01", state=ShardState.STARTING)
    await db(Shard.objects.filter(pk=shard.pk).update)(state_changed_at=started)

    for done in (10**9, 5 * 10**9):
        await agent.send(
            {
                "type": "fetch_progress",
                "v": 1,
                "shard_id": shard.pk,
                "source": "hf://Qwen/Qwen2.5-72B-Instruct",
                "bytes_done": done,
                "bytes_total": 145 * 10**9,
            }
        )
    await agent.heartbeat(seq=1)

    shard = await db(Shard.objects.get)(pk=shard.pk)
    assert shard.fetch_bytes_done == 5 * 10**9 and shard.fetch_bytes_total == 145 * 10**9
    assert shard.fetch_source == "hf://Qwen/Qwen2.5-72B-Instruct"
    assert shard.fetch_updated_at > started
    # A download that takes an hour must not keep the start timer at zero.
    assert shard.state == ShardState.STARTING
    assert shard.state_changed_at == started


async def test_running_shards_on_register_touch_only_this_nodes_shards():
    # given a shard of this node (known before its agent enrols) and one of another node
    await db(Node.objects.create)(id="gpu-01")
    await db(Node.objects.create)(id="gpu-02")
    ours = await db(make_shard)("gpu-01", state=ShardState.PENDING)
    theirs = await db(make_shard)("gpu-02", state=ShardState.READY)
    before = await db(Shard.objects.values().get)(pk=theirs.pk)

    # when the agent registers, reporting both as running in some state
    def running(shard, state):
        return {"shard_id": shard.pk, "replica_id": shard.replica_id, "state": state}

    agent = await enrol(
        "gpu-01",
        running_shards=[running(ours, "loading"), running(theirs, "stopped")],
    )
    await agent.close()

    # then its own shard takes the reported state, the other node's is untouched
    assert (await db(Shard.objects.get)(pk=ours.pk)).state == ShardState.LOADING
    assert await db(Shard.objects.values().get)(pk=theirs.pk) == before
