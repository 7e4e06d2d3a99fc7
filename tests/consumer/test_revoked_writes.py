"""A revoked credential, or a removed node, writes nothing: not even the message that
finds out.

The revocation's doorbell (which closes the socket at once) is taken as lost
here: the credential is revoked behind the consumer's back, so the write path's
own check is all that stands between the node's next message and the database.
"""

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone

from agentd import protocol
from agentd.protocol import CloseCode
from fleet.models import Node, NodeCredential, NodeLoad, NodeState, Storage
from fleet.services import inventory, node_logs
from fleet.services.heartbeat import apply as heartbeat_apply
from tests.consumer.helpers import db, enrol, expect_close, snapshot
from tests.factories import heartbeat_msg, make_shard, register_msg

DISK = [{"path": "/var/lib/llmgw", "free_bytes": 1, "total_bytes": 2}]
LOAD = {
    "cpu_percent": 99.0,
    "cpu_count": 8,
    "load1": 8.0,
    "load5": 8.0,
    "load15": 8.0,
    "memory_used_bytes": 1,
    "memory_available_bytes": 1,
}


def hb(**fields) -> protocol.Heartbeat:
    return protocol.parse_agent_message(heartbeat_msg(**fields))


def suspect_node_with_credential(node_id: str) -> int:
    inventory.register_node(protocol.parse_agent_message(register_msg(node_id)))
    cred, _ = NodeCredential.issue(node=Node.objects.get(pk=node_id))
    Node.objects.filter(pk=node_id).update(
        state=NodeState.SUSPECT, last_seen=timezone.now() - timedelta(minutes=2)
    )
    return cred.pk


def rows(node_id: str) -> dict:
    return {
        "node": Node.objects.filter(pk=node_id).values().first(),
        "storage": list(Storage.objects.filter(node_id=node_id).values()),
        "load": list(NodeLoad.objects.filter(node_id=node_id).values()),
        "weights": list(Node.objects.get(pk=node_id).weights.values()),
    }


# ---- the writers, on every path the database offers ----------------------------------


@pytest.mark.django_db
def test_a_revoked_credentials_heartbeat_writes_nothing(write_path):
    cred = suspect_node_with_credential("gpu-01")
    NodeCredential.objects.filter(pk=cred).update(revoked_at=timezone.now())
    before = rows("gpu-01")

    results = heartbeat_apply.apply_heartbeats(
        [
            (
                "gpu-01",
                cred,
                hb(
                    storage=DISK,
                    load=LOAD,
                    desired_version=1,
                    weights_changed=True,
                    weights=[],
                    memory_total_mb=1,
                ),
                timezone.now(),
            )
        ]
    )

    assert results["gpu-01", cred].revoked
    # Still suspect, not seen, same disks, no load, weights and memory untouched.
    assert rows("gpu-01") == before


@pytest.mark.django_db
def test_of_two_sockets_of_one_node_only_the_live_credentials_heartbeat_is_written(write_path):
    # A reconnect with a new credential while the old socket, whose credential was
    # revoked, still sends: one batch holds both.
    old = suspect_node_with_credential("gpu-01")
    NodeCredential.objects.filter(pk=old).update(revoked_at=timezone.now())
    new, _ = NodeCredential.issue(node=Node.objects.get(pk="gpu-01"))
    stale = [{"path": "/stale", "free_bytes": 9, "total_bytes": 9}]

    results = heartbeat_apply.apply_heartbeats(
        [
            ("gpu-01", old, hb(seq=1, storage=stale), timezone.now()),
            ("gpu-01", new.pk, hb(seq=2, storage=DISK, load=LOAD), timezone.now()),
            ("gpu-01", old, hb(seq=3, storage=stale), timezone.now()),
        ]
    )

    # Each socket hears about its own credential: the new one is not closed as revoked.
    assert results["gpu-01", old].revoked and not results["gpu-01", new.pk].revoked
    node = Node.objects.get(pk="gpu-01")
    assert node.state == NodeState.READY
    assert list(Storage.objects.filter(node_id="gpu-01").values_list("path", flat=True)) == [
        "/var/lib/llmgw"
    ]
    assert NodeLoad.objects.get(node_id="gpu-01").cpu_percent == 99.0


# ---- the socket --------------------------------------------------------------------


def socket_closed(snap: dict) -> dict:
    """The snapshot once gpu-01's socket has closed: the node disconnected, nothing else."""
    nodes = [
        {**n, "connected": False, "channel_name": ""} if n["id"] == "gpu-01" else n
        for n in snap["Node"]
    ]
    return {**snap, "Node": nodes}


def revoke_quietly(node_id: str) -> None:
    """Revoked with no doorbell: as if the channel layer had dropped it."""
    NodeCredential.objects.filter(node_id=node_id).update(revoked_at=timezone.now())


MESSAGES = {
    "heartbeat": lambda shard: heartbeat_msg(
        seq=2,
        storage=DISK,
        load={**LOAD, "shards": [{"shard_id": shard, "cpu_cores": 1.0, "rss_bytes": 1}]},
        desired_version=1,
    ),
    "shard_status": lambda shard: {
        "type": "shard_status",
        "v": 1,
        "shard_id": shard,
        "state": "failed",
        "error": "boom",
    },
    "fetch_progress": lambda shard: {
        "type": "fetch_progress",
        "v": 1,
        "shard_id": shard,
        "bytes_done": 5,
    },
    "ack": lambda shard: {"type": "ack", "v": 1, "of": "desired", "version": 1},
    "register": lambda shard: register_msg("gpu-01", hostname="changed", storage=DISK),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", sorted(MESSAGES))
async def test_a_revoked_nodes_next_message_closes_its_socket_and_writes_nothing(kind):
    agent = await enrol("gpu-01")
    shard = await db(make_shard)("gpu-01")
    await db(Node.objects.filter(pk="gpu-01").update)(
        state=NodeState.SUSPECT, desired_version=1, acked_version=0
    )
    await db(revoke_quietly)("gpu-01")
    before = await db(snapshot)()

    await agent.send(MESSAGES[kind](shard.pk))
    code, reason = await expect_close(agent.comm)

    assert code == CloseCode.REVOKED and "revoked" in reason
    assert await db(snapshot)() == socket_closed(before)


@pytest.mark.django_db(transaction=True)
async def test_a_revoked_nodes_logs_reply_reaches_no_one(settings):
    settings.LLMGW = {**settings.LLMGW, "LOGS_TIMEOUT_S": 2.0}
    agent = await enrol("gpu-01")
    asking = asyncio.ensure_future(node_logs.arequest_logs("gpu-01"))
    request = await agent.recv_type("logs_request")
    await db(revoke_quietly)("gpu-01")

    await agent.send(
        {"type": "logs_reply", "v": 1, "request_id": request["request_id"], "lines": ["secret"]}
    )
    code, _ = await expect_close(agent.comm)

    assert code == CloseCode.REVOKED
    with pytest.raises(node_logs.NodeUnreachable):
        await asking


@pytest.mark.django_db(transaction=True)
async def test_a_removed_nodes_register_brings_nothing_back():
    agent = await enrol("gpu-01")
    await db(Node.objects.filter(pk="gpu-01").delete)()

    await agent.send(register_msg("gpu-01"))
    code, _ = await expect_close(agent.comm)

    assert code == CloseCode.REVOKED
    assert not await db(Node.objects.filter(pk="gpu-01").exists)()
