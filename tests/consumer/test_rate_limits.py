"""One node cannot crowd out the others: each socket's messages and bytes are metered,
and a node past its limits is closed with 4029 while the others go on being acked."""

import asyncio
import json

import pytest

from agentd.protocol import CloseCode
from fleet.models import Node, Storage
from fleet.services import node_logs
from fleet.sockets.metering import TokenBucket
from tests.consumer.helpers import db, enrol, expect_close
from tests.factories import heartbeat_msg

# A rate so low that nothing refills during a test: only the burst counts.
NO_REFILL = 1e-9


@pytest.mark.parametrize(
    "rate, burst, takes, passed",
    [
        # (rate a second, burst, [(amount, at second)], which went through)
        (1, 3, [(1, 0), (1, 0), (1, 0), (1, 0)], [True, True, True, False]),
        (1, 3, [(1, 0), (1, 0), (1, 0), (1, 1)], [True, True, True, True]),  # refilled
        (1, 3, [(3, 0), (1, 100)], [True, True]),
        (1, 3, [(1, 100), (1, 100), (1, 100), (1, 100)], [True, True, True, False]),  # capped
        (2, 10, [(11, 0)], [False]),  # more than the burst never passes
        (0, 0, [(10**9, 0), (10**9, 0)], [True, True]),  # rate 0: no limit
    ],
)
def test_a_token_bucket(rate, burst, takes, passed):
    bucket = TokenBucket(rate, burst, now=0.0)
    assert [bucket.take(amount, now) for amount, now in takes] == passed


def storage(free: int) -> list:
    return [{"path": "/var/lib/llmgw", "free_bytes": free, "total_bytes": 10**12}]


@pytest.mark.django_db(transaction=True)
async def test_a_flooding_node_is_closed_and_the_others_are_still_acked(settings):
    settings.LLMGW = {
        **settings.LLMGW,
        "AGENT_MESSAGES_PER_S": NO_REFILL,
        "AGENT_MESSAGES_BURST": 6,  # its register and five heartbeats
    }
    quiet = await enrol("gpu-02")
    flood = await enrol("gpu-01")

    # Sent all at once, as fast as the socket takes them.
    for seq in range(1, 21):
        await flood.send(heartbeat_msg(seq=seq, storage=storage(seq)))
    acked, closing = [], None
    while (out := await flood.comm.receive_output(3))["type"] == "websocket.send":
        msg = json.loads(out["text"])
        if msg["type"] == "ack":
            acked.append(msg["seq"])
        elif msg["type"] == "closing":
            closing = msg
    await flood.comm.disconnect(code=out["code"])
    code, reason = out["code"], closing["reason"]

    assert code == CloseCode.RATE_LIMITED and "messages" in reason
    assert acked == [1, 2, 3, 4, 5]
    # Nothing past the limit was written.
    stored = await db(Storage.objects.get)(node_id="gpu-01")
    assert stored.free_bytes == 5
    # The other node's socket has a bucket of its own and is heard as before.
    for seq in (1, 2, 3):
        await quiet.heartbeat(seq=seq)
    assert (await db(Node.objects.get)(pk="gpu-02")).connected
    await quiet.close()


@pytest.mark.django_db(transaction=True)
async def test_a_node_sending_too_many_bytes_is_closed_before_the_message_is_read(settings):
    settings.LLMGW = {
        **settings.LLMGW,
        "AGENT_BYTES_PER_S": NO_REFILL,
        "AGENT_BYTES_BURST": 64 * 1024,  # room for its register, not for a big weights list
    }
    agent = await enrol("gpu-01")
    weights = [{"path": f"/models/m-{i:05d}/" + "w" * 200, "size_bytes": i} for i in range(1000)]

    await agent.send(heartbeat_msg(seq=1, weights_changed=True, weights=weights))
    code, reason = await expect_close(agent.comm)

    assert code == CloseCode.RATE_LIMITED and "bytes" in reason
    paths = await db(lambda: list(Node.objects.get(pk="gpu-01").weights.values_list("path")))()
    assert paths == [("/models/qwen",)]  # from its register; the big list was not read


def logs_reply(request_id: str, kib: int) -> dict:
    line = "x" * 1000
    return {
        "type": "logs_reply",
        "v": 1,
        "request_id": request_id,
        "lines": [line] * kib,
        "sources": ["agent"],
    }


@pytest.mark.django_db(transaction=True)
async def test_log_replies_the_control_plane_asked_for_cost_the_socket_nothing(settings):
    settings.LLMGW = {
        **settings.LLMGW,
        "AGENT_MESSAGES_PER_S": NO_REFILL,
        "AGENT_MESSAGES_BURST": 8,  # its register and a few more
        "AGENT_BYTES_PER_S": NO_REFILL,
        "AGENT_BYTES_BURST": 256 * 1024,  # its register and one reply of 200 KiB
    }
    agent = await enrol("gpu-01")

    # when: an operator follows the node's logs, asking again and again, and
    # each reply is near the burst, far more than the limits in all
    for _ in range(10):
        asking = asyncio.ensure_future(node_logs.arequest_logs("gpu-01", lines=200))
        request = await agent.recv_type("logs_request")
        await agent.send(logs_reply(request["request_id"], kib=200))
        reply = await asyncio.wait_for(asking, 5)
        # then: every reply reaches the operator
        assert len(reply.lines) == 200

    # and the node's own budget is whole: its messages are heard as before,
    # a reply of 200 KiB nobody asked for included
    for seq in (1, 2, 3):
        await agent.heartbeat(seq=seq)
    await agent.send(logs_reply("not-asked-for", kib=200))
    await agent.heartbeat(seq=4)
    assert (await db(Node.objects.get)(pk="gpu-01")).connected

    # but that one was the agent's own traffic, charged as any: a second is too much
    await agent.send(logs_reply("not-asked-either", kib=200))
    code, reason = await expect_close(agent.comm)
    assert code == CloseCode.RATE_LIMITED


@pytest.mark.django_db(transaction=True)
async def test_past_its_limits_a_node_is_closed_even_while_a_log_request_waits(settings):
    settings.LLMGW = {
        **settings.LLMGW,
        "AGENT_MESSAGES_PER_S": NO_REFILL,
        "AGENT_MESSAGES_BURST": 3,  # its register and two more
        "LOGS_TIMEOUT_S": 30,
    }
    agent = await enrol("gpu-01")
    asking = asyncio.ensure_future(node_logs.arequest_logs("gpu-01"))
    await agent.recv_type("logs_request")

    # when: the node sends heartbeats past its limit instead of the reply
    for seq in (1, 2, 3):
        await agent.send(heartbeat_msg(seq=seq))
    acked, closing = [], None
    while (out := await agent.comm.receive_output(3))["type"] == "websocket.send":
        msg = json.loads(out["text"])
        if msg["type"] == "ack":
            acked.append(msg["seq"])
        elif msg["type"] == "closing":
            closing = msg
    await agent.comm.disconnect(code=out["code"])

    # then: the waiting request bought it nothing
    assert out["code"] == CloseCode.RATE_LIMITED and "messages" in closing["reason"]
    assert acked == [1, 2]
    asking.cancel()
