"""The agent socket through a real web process (uvicorn through ``llmgw_site.serve``)
and a real WebSocket client.

The server runs in its own process on the test database and Redis; requests to
the agent (logs, desired set, revocation) come from this process, as they would
from another web process, a Celery worker or a management command.
"""

import asyncio
import json

import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agentd.protocol import CloseCode
from fleet.models import Node
from fleet.services import access, node_logs
from fleet.services.desired import bump_desired
from tests.consumer.helpers import db, run_closing_connections, snapshot
from tests.factories import heartbeat_msg, join_token, make_shard, register_msg

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

MiB = 2**20


def connect(server, secret: str | None):
    headers = {"Authorization": f"Bearer {secret}"} if secret is not None else {}
    return websockets.connect(server.ws_url, additional_headers=headers, open_timeout=10)


async def recv(ws, kind: str, timeout: float = 5) -> dict:
    """The next message of this type, skipping provision (sent at every registration)."""
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if msg["type"] == kind:
            return msg
        assert msg["type"] == "provision", msg


async def closed_with(ws, timeout: float = 5) -> tuple[int, str]:
    """Wait for the server to close; returns the close code and the reason it gave.

    The reason comes in the `closing` message sent just before, which must name the
    same code (a server may drop a close frame's reason: Daphne does,
    django/daphne#374). uvicorn sends the frame's reason too: then it is the
    message's, cut to fit a frame.
    """
    closing = None
    with pytest.raises(ConnectionClosed) as info:
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            if msg["type"] == "closing":
                closing = msg
    if info.value.rcvd is None:
        return 1006, ""  # no close frame: the connection was dropped (abnormal closure)
    code = info.value.rcvd.code
    if closing is None:
        return code, ""
    assert closing["code"] == code, (closing, code)
    said = info.value.rcvd.reason
    assert said in ("", closing["reason"][:120]), (said, closing)
    return code, closing["reason"]


async def refused_status(server, secret) -> int:
    with pytest.raises(InvalidStatus) as info:
        async with connect(server, secret):
            pass
    return info.value.response.status_code


def in_thread(fn, *args):
    return asyncio.to_thread(run_closing_connections, fn, *args)


async def enrol(server, node_id: str):
    """Enrol a node with a fresh join token; returns its credential."""
    _, secret = await db(join_token)()
    async with connect(server, secret) as ws:
        await ws.send(json.dumps(register_msg(node_id)))
        ack = await recv(ws, "ack")
        await recv(ws, "desired")
    return ack["credential"]


async def test_an_agent_lives_its_life_over_a_real_server(live_web):
    server = live_web
    # Refused before the socket opens: the server answers the handshake with 403.
    assert await refused_status(server, None) == 403
    assert await refused_status(server, "lgn_deadbeef_notarealcredential") == 403

    credential = await enrol(server, "gpu-01")
    assert credential.startswith("lgn_")
    await db(make_shard)("gpu-01")

    async with connect(server, credential) as ws:
        await ws.send(json.dumps(register_msg("gpu-01")))
        ack = await recv(ws, "ack")
        assert ack["credential"] is None
        first = await recv(ws, "desired")
        assert len(first["shards"]) == 1
        await ws.send(json.dumps(heartbeat_msg(seq=7, desired_version=first["version"])))
        assert (await recv(ws, "ack"))["seq"] == 7

        # Logs asked from this process reach the agent through Redis and come back.
        asking = asyncio.ensure_future(node_logs.arequest_logs("gpu-01", lines=2))
        request = await recv(ws, "logs_request")
        await ws.send(
            json.dumps(
                {
                    "type": "logs_reply",
                    "v": 1,
                    "request_id": request["request_id"],
                    "lines": ["a", "b"],
                }
            )
        )
        assert (await asyncio.wait_for(asking, 10)).lines == ["a", "b"]

        # A change made elsewhere, as the reconciler in Celery would make it.
        await in_thread(bump_desired, ["gpu-01"])
        assert (await recv(ws, "desired"))["version"] == first["version"] + 1

        # A reconnect wins over the socket it replaces.
        async with connect(server, credential) as ws2:
            await ws2.send(json.dumps(register_msg("gpu-01")))
            await recv(ws2, "ack")
            current = (await recv(ws2, "desired"))["version"]
            assert (await closed_with(ws)) == (
                CloseCode.SUPERSEDED,
                "the same node connected again",
            )
            await ws2.send(json.dumps(heartbeat_msg(seq=8, desired_version=current)))
            await recv(ws2, "ack")
            assert (await db(Node.objects.get)(pk="gpu-01")).connected

            # Revoked from this process: the doorbell closes the socket within seconds.
            await in_thread(lambda: access.revoke_node(Node.objects.get(pk="gpu-01")))
            code, reason = await closed_with(ws2)
            assert code == CloseCode.REVOKED and "revoked" in reason

    # And the credential opens nothing any more.
    assert await refused_status(server, credential) == 403
    # The server records the closed socket once its disconnect handler has run,
    # which on a busy machine can be a moment after the client saw the close.
    for _ in range(100):
        node = await db(Node.objects.get)(pk="gpu-01")
        if not node.connected:
            break
        await asyncio.sleep(0.1)
    assert node.connected is False and node.state == "ready"


async def test_bad_frames_over_a_real_server(live_web):
    server = live_web
    # What a message over 1 MiB costs the agent: uvicorn (websockets) closes with
    # 1009 "message too big".
    too_big = 1009
    credential = await enrol(server, "gpu-01")

    async def registered():
        ws = await connect(server, credential)
        await ws.send(json.dumps(register_msg("gpu-01")))
        await recv(ws, "ack")
        await recv(ws, "desired")
        return ws

    # Just under the limit is fine: the socket lives on.
    ws = await registered()
    lines = ["x" * 4000] * 230  # about 0.9 MiB of JSON
    big = json.dumps({"type": "logs_reply", "v": 1, "request_id": "late", "lines": lines})
    assert 0.85 * MiB < len(big) < MiB
    await ws.send(big)
    await ws.send(json.dumps(heartbeat_msg(seq=1)))
    assert (await recv(ws, "ack"))["seq"] == 1

    # Over the 1 MiB message limit the consumer never sees the message, and
    # nothing is written.
    before = await db(snapshot)()
    await ws.send(json.dumps({**heartbeat_msg(seq=2), "memory_total_mb": 1, "pad": "x" * MiB}))
    code, _ = await closed_with(ws)
    assert code == too_big
    after = await db(snapshot)()
    assert after["Node"][0]["memory_total_mb"] == 2063500
    assert {k: v for k, v in after.items() if k != "Node"} == {
        k: v for k, v in before.items() if k != "Node"
    }

    cases = [
        ("text", "binary", b"\x00\x01", CloseCode.INVALID_MESSAGE, "binary frames"),
        ("text", "bad json", "{", CloseCode.INVALID_MESSAGE, "not JSON"),
        (
            "first",
            "heartbeat first",
            json.dumps(heartbeat_msg()),
            CloseCode.NOT_REGISTERED,
            "before",
        ),
        (
            "first",
            "another node",
            json.dumps(register_msg("gpu-02")),
            CloseCode.FORBIDDEN,
            "not 'gpu-02'",
        ),
    ]
    for when, what, frame, want, says in cases:
        if when == "first":
            ws = await connect(server, credential)
        else:
            ws = await registered()
        await ws.send(frame)
        code, reason = await closed_with(ws)
        assert (what, code) == (what, want)
        assert says in reason, (what, reason)
    assert not await db(Node.objects.filter(pk="gpu-02").exists)()

    log = server.output()
    # The oversize frame is seen in the log only as the socket closing with that code.
    assert log.count(f"agent stream closed node=gpu-01 code={too_big}") == 1
    assert log.count("agent socket closed code=4003") == 1
    assert "Traceback" not in log
