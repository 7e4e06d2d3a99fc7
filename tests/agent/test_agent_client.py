"""The socket: backoff, what ends the agent and what it retries, against a real WebSocket server.

The server here is a small scripted control plane on loopback, so a test can
choose the close code; the real control plane is in test_agent_e2e.py.
"""

import asyncio
import json
import random
import time

import pytest
import websockets
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.http11 import Response

from agentd import client, protocol
from agentd.protocol import CloseCode
from tests.agent.test_agent_messages import make_agent


def test_backoff_doubles_from_one_second_to_thirty_with_jitter():
    backoff = client.Backoff(rng=random.Random(7))
    ceilings = [1, 2, 4, 8, 16, 30, 30, 30]
    delays = [backoff.next() for _ in ceilings]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len({round(d, 6) for d in delays[5:]}) == 3  # jittered, not lockstep
    backoff.reset()
    assert 0.5 <= backoff.next() <= 1


def test_jitter_spreads_a_fleet_reconnecting_at_once():
    firsts = [client.Backoff(rng=random.Random(i)).next() for i in range(200)]
    assert min(firsts) < 0.6 and max(firsts) > 0.9


class ScriptedControlPlane:
    """Accepts agents on loopback and plays a script per connection."""

    def __init__(self, scripts):
        self.scripts = list(scripts)
        self.connections = 0
        self.registers: list[dict] = []
        self.received: list[dict] = []
        self.auth: list[str] = []
        self.refused_at: list[float] = []
        self.connected_at: list[float] = []

    async def handler(self, ws):
        self.connections += 1
        self.connected_at.append(time.monotonic())
        self.auth.append(ws.request.headers.get("Authorization", ""))
        script = self.scripts.pop(0) if self.scripts else "hold"
        reg = json.loads(await ws.recv())
        self.registers.append(reg)
        ack = {"type": "ack", "v": 1, "of": "register", "node_id": reg["node_id"]}
        ack["heartbeat_interval_s"] = 0.05
        if script == "enrol":
            ack["credential"] = "nc_issued_secret"
        await ws.send(json.dumps(ack))
        if script == "enrol":
            script = int(CloseCode.SUPERSEDED)  # enrolled; then a reconnect is forced
        if isinstance(script, int):
            await ws.close(code=script, reason="scripted")
            return
        async for raw in ws:
            self.received.append(json.loads(raw))

    async def refuse_http(self, connection, request):
        if self.scripts and self.scripts[0] == "http403":
            self.scripts.pop(0)
            self.connections += 1
            return connection.respond(403, "Forbidden\n")
        if self.scripts and str(self.scripts[0]).startswith("http503"):
            # "http503" or "http503:<Retry-After>": the control plane too busy for now
            _, _, after = self.scripts.pop(0).partition(":")
            self.connections += 1
            self.refused_at.append(time.monotonic())
            response = connection.respond(503, "too many agents registering at once\n")
            if after:
                response.headers["Retry-After"] = after
            return response
        return None


async def _serve(plane):
    return await websockets.serve(plane.handler, "127.0.0.1", 0, process_request=plane.refuse_http)


def _url(server):
    port = server.sockets[0].getsockname()[1]
    return f"ws://127.0.0.1:{port}/ws/agent/"


def _quick():
    return client.Backoff(first=0.01, cap=0.02)


async def _wait_for(check, timeout=10):
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("code", [CloseCode.FORBIDDEN, CloseCode.REVOKED])
async def test_forbidden_and_revoked_are_fatal(tmp_path, code):
    plane = ScriptedControlPlane([int(code)])
    async with await _serve(plane) as server:
        agent = make_agent(tmp_path, control_plane_url=_url(server))
        with pytest.raises(client.Refused, match=f"closed the socket with {int(code)}"):
            await asyncio.wait_for(client.run(agent, asyncio.Event(), _quick()), 10)
    assert plane.connections == 1  # never retried


async def test_http_403_at_the_handshake_is_fatal(tmp_path):
    plane = ScriptedControlPlane(["http403"])
    async with await _serve(plane) as server:
        agent = make_agent(tmp_path, control_plane_url=_url(server))
        with pytest.raises(client.Refused, match="refused this node's join token"):
            await asyncio.wait_for(client.run(agent, asyncio.Event(), _quick()), 10)


def _busy(retry_after: str | None) -> InvalidStatus:
    headers = Headers({"Retry-After": retry_after} if retry_after is not None else {})
    return InvalidStatus(Response(503, "Service Unavailable", headers, b"busy\n"))


def test_a_busy_control_planes_retry_after_is_the_wait_not_the_backoff():
    backoff = client.Backoff(rng=random.Random(2))
    waits = [backoff.wait_after(_busy("7")) for _ in range(50)]
    assert all(7 <= w < 8 for w in waits)  # what it asked, and up to a second of jitter
    assert backoff.attempt == 0  # the backoff did not grow meanwhile
    assert backoff.wait_after(_busy("600")) == 30  # never past the agent's own cap


@pytest.mark.parametrize("header", [None, "Wed, 21 Oct 2026 07:28:00 GMT", "-3", "soon"])
def test_a_503_without_seconds_to_wait_falls_back_to_the_backoff(header):
    backoff = client.Backoff(rng=random.Random(2))
    assert client.retry_after_s(_busy(header)) is None
    assert 0.5 <= backoff.wait_after(_busy(header)) <= 1
    assert backoff.attempt == 1


async def test_an_agent_told_to_come_back_later_waits_so_long_then_registers(tmp_path):
    # given: a control plane that turns the first handshake away for 1 s
    plane = ScriptedControlPlane(["http503:1"])
    stop = asyncio.Event()
    async with await _serve(plane) as server:
        agent = make_agent(tmp_path, control_plane_url=_url(server))
        # (a backoff of 10 ms doubling, under agentd's own cap of 30 s)
        task = asyncio.ensure_future(client.run(agent, stop, client.Backoff(first=0.01)))
        # when: it knocks again, it registers (a 503 is not a refusal of the node)
        await _wait_for(lambda: len(plane.registers) == 1)
        stop.set()
        await asyncio.wait_for(task, 10)
    # then: it waited what it was told, not its backoff's 5-10 ms
    assert plane.connected_at[0] - plane.refused_at[0] >= 1.0


async def test_superseded_and_dropped_connections_are_retried(tmp_path):
    plane = ScriptedControlPlane([int(CloseCode.SUPERSEDED), int(CloseCode.INVALID_MESSAGE)])
    stop = asyncio.Event()
    async with await _serve(plane) as server:
        agent = make_agent(tmp_path, control_plane_url=_url(server))
        await agent.start()
        task = asyncio.ensure_future(client.run(agent, stop, _quick()))
        # the third connection holds; heartbeats flow on it at the ack's interval
        await _wait_for(lambda: plane.connections == 3 and len(plane.received) >= 2)
        stop.set()
        await asyncio.wait_for(task, 10)
        await agent.close()
    assert [m["type"] for m in plane.received[:2]] == ["heartbeat", "heartbeat"]
    assert plane.received[-1] == {"type": "goodbye", "v": 1, "reason": "agent stopping"}
    assert all(r["node_id"] == "gpu-t1" for r in plane.registers)


async def test_enrolment_keeps_the_credential_and_uses_it_next_time(tmp_path):
    plane = ScriptedControlPlane(["enrol", int(CloseCode.SUPERSEDED), "hold"])
    stop = asyncio.Event()
    async with await _serve(plane) as server:
        agent = make_agent(tmp_path, control_plane_url=_url(server))
        task = asyncio.ensure_future(client.run(agent, stop, _quick()))
        await _wait_for(lambda: plane.connections == 3)
        stop.set()
        await asyncio.wait_for(task, 10)
    assert plane.auth[0] == "Bearer jt_test"
    assert plane.auth[1:] == ["Bearer nc_issued_secret"] * 2
    cred = agent.cfg.credential_path
    assert cred.read_text().strip() == "nc_issued_secret"
    assert cred.stat().st_mode & 0o777 == 0o600


async def test_a_desired_set_is_acknowledged_over_the_socket(tmp_path):
    stop = asyncio.Event()
    sent = asyncio.Event()

    async def handler(ws):
        reg = json.loads(await ws.recv())
        await ws.send(
            protocol.dump(protocol.ServerAck(type="ack", of="register", node_id=reg["node_id"]))
        )
        await ws.send(protocol.dump(protocol.Desired(type="desired", version=7)))
        async for raw in ws:
            msg = json.loads(raw)
            if msg["type"] == "ack":
                assert msg == {
                    "type": "ack",
                    "v": 1,
                    "of": "desired",
                    "version": 7,
                    "ok": True,
                    "detail": "",
                    # remove_weights' reply fields, empty on any other ack
                    "request_id": "",
                    "removed": [],
                    "kept": [],
                }
                sent.set()

    async with websockets.serve(handler, "127.0.0.1", 0) as server:
        agent = make_agent(tmp_path, control_plane_url=_url(server))
        await agent.start()
        task = asyncio.ensure_future(client.run(agent, stop, _quick()))
        await asyncio.wait_for(sent.wait(), 10)
        stop.set()
        await asyncio.wait_for(task, 10)
        await agent.close()
    assert agent.desired_version == 7


async def test_an_unreachable_control_plane_is_retried_not_fatal(tmp_path):
    # a port nothing listens on
    agent = make_agent(tmp_path, control_plane_url="ws://127.0.0.1:9/ws/agent/")
    stop = asyncio.Event()
    backoff = _quick()
    task = asyncio.ensure_future(client.run(agent, stop, backoff))
    await _wait_for(lambda: backoff.attempt >= 3)
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_stopping_while_the_handshake_hangs_does_not_wait_for_the_timeout(tmp_path):
    # given: a control plane that accepts TCP connections and never answers
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    agent = make_agent(tmp_path, control_plane_url=f"ws://127.0.0.1:{port}/ws/agent/")
    stop = asyncio.Event()
    task = asyncio.ensure_future(client.run(agent, stop, _quick()))
    await asyncio.sleep(0.2)
    # when: SIGTERM's stop arrives mid-handshake; then: run ends well before open_timeout
    stop.set()
    await asyncio.wait_for(task, 5)  # the handshake's own timeout is 10 s
    silent.close()


async def test_without_an_interval_in_the_ack_the_configured_one_is_used(tmp_path):
    beats = []

    async def handler(ws):
        reg = json.loads(await ws.recv())
        # an ack as a control plane that does not name an interval would send it
        await ws.send(
            json.dumps({"type": "ack", "v": 1, "of": "register", "node_id": reg["node_id"]})
        )
        async for raw in ws:
            beats.append(json.loads(raw)["type"])

    async with websockets.serve(handler, "127.0.0.1", 0) as server:
        agent = make_agent(tmp_path, control_plane_url=_url(server), heartbeat_interval_s=0.05)
        stop = asyncio.Event()
        task = asyncio.ensure_future(client.run(agent, stop, _quick()))
        await _wait_for(lambda: beats.count("heartbeat") >= 3)  # not one in 10 s
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_shard_that_gave_its_gpu_memory_back_is_followed_by_a_heartbeat_at_once(
    tmp_path,
):
    # given: an agent whose heartbeats are a minute apart, registered
    received = []
    acked = asyncio.Event()

    async def handler(ws):
        reg = json.loads(await ws.recv())
        await ws.send(
            json.dumps({"type": "ack", "v": 1, "of": "register", "node_id": reg["node_id"]})
        )
        acked.set()
        async for raw in ws:
            msg = json.loads(raw)
            received.append((msg["type"], msg.get("state")))

    async with websockets.serve(handler, "127.0.0.1", 0) as server:
        agent = make_agent(tmp_path, control_plane_url=_url(server), heartbeat_interval_s=60)
        stop = asyncio.Event()
        task = asyncio.ensure_future(client.run(agent, stop, _quick()))
        await asyncio.wait_for(acked.wait(), 10)

        # when: a shard starts loading (its engine takes memory)
        await agent.on_shard_event(
            protocol.ShardStatus(type="shard_status", shard_id="s1", state="loading")
        )
        await asyncio.sleep(0.5)
        # then: its state goes out, and no heartbeat before the minute is up
        assert received == [("shard_status", "loading")]

        # when: twenty shards go to sleep or stop at once
        for i in range(20):
            state = "asleep" if i % 2 else "stopped"
            await agent.on_shard_event(
                protocol.ShardStatus(type="shard_status", shard_id=f"s{i}", state=state)
            )
        # then: a heartbeat follows their states, telling the GPU memory they gave back
        await _wait_for(lambda: ("heartbeat", None) in received)
        assert received.index(("heartbeat", None)) == 21
        # and one heartbeat says it for all twenty
        await asyncio.sleep(1)
        assert received.count(("heartbeat", None)) == 1
        stop.set()
        await asyncio.wait_for(task, 10)
