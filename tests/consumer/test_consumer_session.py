"""A socket's life: logs on request, reconnects, revocation and the desired set.

Requests come from outside the consumer through the channel layer (Redis), as
they would from another web process, a Celery worker or a page.
"""

import asyncio
import logging

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from channels.layers import get_channel_layer
from django.db.models import F
from django.utils import timezone

from agentd.protocol import CloseCode
from fleet.metrics import REGISTRY
from fleet.models import DesiredState, Node, NodeCredential, NodeState
from fleet.services import access, doorbells, node_logs
from fleet.services.desired import bump_desired
from tests.consumer.helpers import (
    communicator,
    connect_as,
    db,
    enrol,
    expect_close,
    run_closing_connections,
)
from tests.factories import make_shard

pytestmark = pytest.mark.django_db(transaction=True)


def in_thread(fn, *args):
    """Run sync code in a worker thread, as Celery or a management command would."""
    return asyncio.to_thread(run_closing_connections, fn, *args)


async def node(node_id="gpu-01") -> Node:
    return await db(Node.objects.get)(pk=node_id)


# ---- logs ----------------------------------------------------------------------


async def test_logs_requested_from_outside_get_the_agents_reply():
    agent = await enrol("gpu-01")
    asking = asyncio.ensure_future(node_logs.arequest_logs("gpu-01", source="agent", lines=3))

    request = await agent.recv_type("logs_request")
    assert request["source"] == "agent" and request["lines"] == 3
    await agent.send(
        {
            "type": "logs_reply",
            "v": 1,
            "request_id": request["request_id"],
            "lines": ["starting", "registered", "heartbeat ok"],
            "sources": ["agent", "shard-1"],
        }
    )

    reply = await asyncio.wait_for(asking, 5)
    assert reply.lines == ["starting", "registered", "heartbeat ok"]
    assert reply.sources == ["agent", "shard-1"]
    await agent.close()


async def test_logs_requested_from_a_sync_view_get_the_reply():
    # As Django runs a sync view under Daphne: in a thread of its own request
    # context, from which request_logs hops back onto the server's loop, the
    # one its channel layer belongs to.
    agent = await enrol("gpu-01")

    async def sync_view():
        async with ThreadSensitiveContext():
            return await sync_to_async(node_logs.request_logs)("gpu-01", "shard-1", 50)

    asking = asyncio.ensure_future(sync_view())

    request = await agent.recv_type("logs_request")
    assert request["source"] == "shard-1" and request["lines"] == 50
    await agent.send(
        {"type": "logs_reply", "v": 1, "request_id": request["request_id"], "error": "no shard"}
    )

    reply = await asyncio.wait_for(asking, 5)
    assert reply.error == "no shard" and reply.lines == []
    await agent.close()


async def test_an_agent_that_never_answers_is_unreachable_after_the_bound(settings):
    settings.LLMGW = {**settings.LLMGW, "LOGS_TIMEOUT_S": 0.3}
    agent = await enrol("gpu-01")

    with pytest.raises(node_logs.NodeUnreachable, match="gpu-01 did not answer within 0.3 s"):
        await node_logs.arequest_logs("gpu-01")

    # It was asked; it just never said anything. A late answer harms nothing.
    request = await agent.recv_type("logs_request")
    await agent.send({"type": "logs_reply", "v": 1, "request_id": request["request_id"]})
    await agent.heartbeat(seq=1)
    await agent.close()


async def dropped_replies() -> float:
    # Off the event loop: the registry's collectors read the database.
    return await sync_to_async(REGISTRY.get_sample_value)("llmgw_agent_logs_replies_dropped_total")


async def test_a_reply_to_an_asker_whose_channel_is_full_is_dropped_and_counted(caplog):
    agent = await enrol("gpu-01")
    layer = get_channel_layer()
    # given: an asker in another process that stopped reading, its channel full
    stuck = "specific.stuck-process!asker"
    for _ in range(layer.get_capacity(stuck)):
        await layer.send(stuck, {"type": "logs.reply", "request_id": "older"})
    dropped = await dropped_replies()

    # when: it asks the node for its logs, and the agent answers
    await doorbells.aring_node(
        "gpu-01", doorbells.NODE_LOGS_REQUEST, request_id="r-1", reply_channel=stuck
    )
    request = await agent.recv_type("logs_request")
    await agent.send({"type": "logs_reply", "v": 1, "request_id": request["request_id"]})

    # then: the socket goes on, the reply dropped, counted and logged
    await agent.heartbeat(seq=1)
    assert (await node()).connected
    assert await dropped_replies() == dropped + 1
    assert "log reply dropped, the asker's channel is over capacity node=gpu-01" in caplog.text
    # and an asker that reads is answered as before
    asking = asyncio.ensure_future(node_logs.arequest_logs("gpu-01", lines=1))
    request = await agent.recv_type("logs_request")
    await agent.send(
        {"type": "logs_reply", "v": 1, "request_id": request["request_id"], "lines": ["ok"]}
    )
    assert (await asyncio.wait_for(asking, 5)).lines == ["ok"]
    await agent.close()


async def test_a_node_with_no_socket_is_unreachable(settings):
    settings.LLMGW = {**settings.LLMGW, "LOGS_TIMEOUT_S": 0.2}
    with pytest.raises(node_logs.NodeUnreachable):
        await node_logs.arequest_logs("gpu-99")


# ---- reconnect and close -------------------------------------------------------


async def test_a_reconnect_closes_the_old_socket_and_the_new_one_holds_the_node(caplog):
    caplog.set_level(logging.INFO)
    old = await enrol("gpu-01")

    new = await connect_as(old.credential, "gpu-01")
    code, reason = await expect_close(old.comm)  # completes the old socket's close, too

    assert code == CloseCode.SUPERSEDED
    assert "connected again" in reason
    # The old socket closing after the reconnect does not mark the node disconnected.
    n = await node()
    assert n.connected and n.state == NodeState.READY
    await new.heartbeat(seq=1)
    assert (await node()).connected
    assert not [r for r in caplog.records if "agent stream closed" in r.getMessage()]
    await new.close()


async def test_closing_a_socket_is_not_losing_the_node(caplog):
    caplog.set_level(logging.INFO)
    agent = await enrol("gpu-01")
    await agent.heartbeat(seq=1)
    seen = (await node()).last_seen

    await agent.close()

    n = await node()
    assert n.connected is False and n.channel_name == ""
    assert n.state == NodeState.READY and n.last_seen == seen
    assert len([r for r in caplog.records if "agent stream closed node=gpu-01" in r.getMessage()])


async def test_a_channel_layer_error_ending_the_socket_lets_the_node_go(caplog, monkeypatch):
    # Redis going away fails the consumer's channel-layer receive: Daphne closes
    # the socket with 1011. The node is marked disconnected as for any close, and
    # the register deadline is not left to fire on a socket already gone.
    import redis
    from channels.layers import get_channel_layer

    caplog.set_level(logging.INFO)
    layer = get_channel_layer()
    real_receive = layer.receive
    redis_gone = asyncio.Event()

    async def receive(channel):
        reading = asyncio.ensure_future(real_receive(channel))
        gone = asyncio.ensure_future(redis_gone.wait())
        done, _ = await asyncio.wait({reading, gone}, return_when=asyncio.FIRST_COMPLETED)
        if gone in done:
            reading.cancel()
            raise redis.ConnectionError("Connection closed by server.")
        gone.cancel()
        return reading.result()

    monkeypatch.setattr(layer, "receive", receive)
    agent = await enrol("gpu-01")
    await agent.heartbeat(seq=1)
    assert (await node()).connected

    redis_gone.set()
    with pytest.raises(redis.ConnectionError):
        await agent.comm.receive_output(3)

    n = await node()
    assert n.connected is False and n.channel_name == ""
    assert n.state == NodeState.READY
    messages = [r.getMessage() for r in caplog.records]
    assert any("agent socket ended by an error node=gpu-01" in m for m in messages)
    assert any("agent stream closed node=gpu-01 code=1011" in m for m in messages)


async def test_goodbye_closes_normally_and_keeps_the_node():
    agent = await enrol("gpu-01")
    await agent.send({"type": "goodbye", "v": 1, "reason": "SIGTERM"})
    code, _ = await expect_close(agent.comm)
    assert code == CloseCode.NORMAL
    n = await node()
    assert n.connected is False and n.state == NodeState.READY


# ---- revocation ----------------------------------------------------------------


async def test_revoking_a_node_closes_its_socket_and_refuses_it_after():
    agent = await enrol("gpu-01")

    count = await in_thread(lambda: access.revoke_node(Node.objects.get(pk="gpu-01")))
    code, reason = await expect_close(agent.comm, timeout=5)

    assert count == 1
    assert code == CloseCode.REVOKED and "revoked" in reason
    assert not (await node()).connected
    connected, _ = await communicator(agent.credential).connect()
    assert not connected


async def test_a_lost_revocation_doorbell_is_healed_by_the_next_heartbeat():
    # Revoked behind the consumer's back: no doorbell rings.
    agent = await enrol("gpu-01")
    await db(NodeCredential.objects.filter(node_id="gpu-01").update)(revoked_at=timezone.now())

    await agent.send({"type": "heartbeat", "v": 1, "seq": 1})
    code, _ = await expect_close(agent.comm)

    assert code == CloseCode.REVOKED
    connected, _ = await communicator(agent.credential).connect()
    assert not connected


async def test_a_doorbell_for_a_credential_that_still_holds_changes_nothing():
    # Another credential of the node was revoked; this socket's own is still good.
    agent = await enrol("gpu-01")
    await doorbells.aring_node("gpu-01", doorbells.NODE_REVOKED)
    await agent.heartbeat(seq=1)
    assert (await node()).connected
    await agent.close()


async def test_a_removed_node_is_closed_on_its_next_heartbeat():
    agent = await enrol("gpu-01")
    await db(Node.objects.filter(pk="gpu-01").delete)()
    await agent.send({"type": "heartbeat", "v": 1, "seq": 1})
    code, reason = await expect_close(agent.comm)
    assert code == CloseCode.REVOKED and "removed" in reason


# ---- the desired set -----------------------------------------------------------


async def test_register_brings_the_full_desired_set():
    await db(Node.objects.create)(id="gpu-01", desired_version=6)
    shard = await db(make_shard)("gpu-01")
    await db(make_shard)("gpu-01", state="stopped", desired_state=DesiredState.STOPPED)

    agent = await enrol("gpu-01")  # a node known before its first agent, e.g. pre-declared

    desired = agent.desired
    assert desired["version"] == 6
    # Stopped and meant to stay stopped: nothing for the agent to do.
    assert [s["shard_id"] for s in desired["shards"]] == [shard.pk]
    s = desired["shards"][0]
    assert s["state"] == "running" and s["model"] == "qwen-0.5b" and s["port"] == 8001
    assert s["profile"]["engine"] == "llamacpp"
    assert s["profile"]["model_path"] == "/models/qwen-0.5b.gguf"
    assert s["profile"]["served_model_name"] == "qwen-0.5b"
    await agent.close()


async def test_bump_desired_from_sync_code_rings_the_node():
    agent = await enrol("gpu-01")
    first = agent.desired["version"]

    shard = await db(make_shard)("gpu-01")
    await in_thread(bump_desired, ["gpu-01"])

    desired = await agent.recv_type("desired", timeout=5)
    assert desired["version"] > first
    assert [s["shard_id"] for s in desired["shards"]] == [shard.pk]
    await agent.close()


async def test_a_heartbeat_behind_the_desired_version_gets_the_set_again():
    agent = await enrol("gpu-01")
    # The version moves on but the doorbell is lost (no ring at all here).
    await db(Node.objects.filter(pk="gpu-01").update)(desired_version=F("desired_version") + 3)
    current = (await node()).desired_version

    await agent.heartbeat(seq=1, desired_version=agent.desired["version"])
    healed = await agent.recv_type("desired")
    assert healed["version"] == current

    # Once the agent is at the current version, heartbeats bring no more copies.
    await agent.heartbeat(seq=2, desired_version=current)
    assert await agent.comm.receive_nothing(timeout=0.3)
    assert (await node()).acked_version == current
    await agent.close()


async def test_an_ack_of_the_desired_set_is_recorded_and_never_goes_back():
    await db(Node.objects.create)(id="gpu-01", desired_version=5)
    agent = await enrol("gpu-01")
    assert (await node()).acked_version == 0

    # The heartbeats here carry no desired_version, so only the acks move
    # acked_version; each heartbeat is answered with the set again (healing).
    await agent.send({"type": "ack", "v": 1, "of": "desired", "version": 5})
    await agent.heartbeat(seq=1)
    await agent.recv_type("desired")
    assert (await node()).acked_version == 5

    # A stale ack arriving late does not move it back; one from the future is capped.
    await agent.send({"type": "ack", "v": 1, "of": "desired", "version": 3})
    await agent.send({"type": "ack", "v": 1, "of": "desired", "version": 99})
    await agent.heartbeat(seq=2)
    await agent.recv_type("desired")
    assert (await node()).acked_version == 5
    await agent.close()


async def test_an_agent_ahead_of_a_restored_database_gets_versions_it_will_accept():
    # given: the database was restored from a backup, so it knows version 2 while
    # the agent already applied 40 and ignores anything older (fencing)
    await db(Node.objects.create)(id="gpu-01", desired_version=2)
    shard = await db(make_shard)("gpu-01")

    # when
    agent = await enrol("gpu-01", desired_version=40)

    # then: the set it receives is newer than anything it has seen, so it applies it
    assert agent.desired["version"] > 40
    assert [s["shard_id"] for s in agent.desired["shards"]] == [shard.pk]
    assert (await node()).desired_version == agent.desired["version"]
    await agent.close()
