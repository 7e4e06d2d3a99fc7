"""A node speaks only for its own shards: load, status or progress under another
node's shard id is dropped (and logged), and the rest of its message still counts."""

import logging

import pytest
from django.utils import timezone

from agentd import protocol
from fleet.models import Node, NodeCredential, NodeLoad, Shard, ShardLoad, Storage
from fleet.services import inventory
from fleet.services.heartbeat import apply as heartbeat_apply
from tests.consumer.helpers import db, enrol
from tests.factories import heartbeat_msg, make_shard, register_msg

DISK = [{"path": "/var/lib/llmgw", "free_bytes": 3, "total_bytes": 4}]
LOAD = {
    "cpu_percent": 10.0,
    "cpu_count": 8,
    "load1": 1.0,
    "load5": 1.0,
    "load15": 1.0,
    "memory_used_bytes": 1,
    "memory_available_bytes": 1,
}


def shard_load(shard_id: str, cores: float = 1.0) -> dict:
    return {"shard_id": shard_id, "cpu_cores": cores, "rss_bytes": 1}


@pytest.mark.django_db
def test_load_under_another_nodes_shard_is_dropped_and_the_rest_written(write_path):
    creds = {}
    for node_id in ("gpu-01", "gpu-02"):
        inventory.register_node(protocol.parse_agent_message(register_msg(node_id)))
        creds[node_id] = NodeCredential.issue(node=Node.objects.get(pk=node_id))[0].pk
    mine = make_shard("gpu-01").pk
    theirs = make_shard("gpu-02").pk
    hb = protocol.parse_agent_message(
        heartbeat_msg(
            storage=DISK,
            load={
                **LOAD,
                "shards": [shard_load(mine), shard_load(theirs, 9.0), shard_load("nope")],
            },
        )
    )

    results = heartbeat_apply.apply_heartbeats([("gpu-01", creds["gpu-01"], hb, timezone.now())])

    result = results["gpu-01", creds["gpu-01"]]
    assert not result.revoked
    assert sorted(result.foreign_shards) == sorted([theirs, "nope"])
    assert list(ShardLoad.objects.values_list("node_id", "shard_id")) == [("gpu-01", mine)]
    assert NodeLoad.objects.get(node_id="gpu-01").cpu_percent == 10.0
    assert Storage.objects.get(node_id="gpu-01").free_bytes == 3


@pytest.mark.django_db(transaction=True)
async def test_the_socket_acks_and_logs_a_foreign_shard_once(caplog):
    caplog.set_level(logging.WARNING, logger="fleet")
    other = await enrol("gpu-02")
    theirs = (await db(make_shard)("gpu-02")).pk
    agent = await enrol("gpu-01")
    mine = (await db(make_shard)("gpu-01")).pk
    load = {**LOAD, "shards": [shard_load(mine), shard_load(theirs)]}

    await agent.heartbeat(seq=1, load=load)
    await agent.heartbeat(seq=2, load=load)

    assert await db(lambda: list(ShardLoad.objects.values_list("node_id", "shard_id")))() == [
        ("gpu-01", mine)
    ]
    dropped = [r for r in caplog.records if "does not hold" in r.getMessage()]
    assert len(dropped) == 1 and theirs in dropped[0].getMessage()
    await agent.close()
    await other.close()


@pytest.mark.django_db(transaction=True)
async def test_progress_for_another_nodes_shard_changes_nothing():
    other = await enrol("gpu-02")
    theirs = await db(make_shard)("gpu-02", state="starting")
    agent = await enrol("gpu-01")

    await agent.send({"type": "fetch_progress", "v": 1, "shard_id": theirs.pk, "bytes_done": 7})
    await agent.heartbeat(seq=1)  # the progress was handled before this is acked

    shard = await db(Shard.objects.get)(pk=theirs.pk)
    assert shard.fetch_bytes_done == theirs.fetch_bytes_done and shard.fetch_updated_at is None
    await agent.close()
    await other.close()
