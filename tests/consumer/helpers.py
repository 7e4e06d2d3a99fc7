"""Helpers for the agent-socket tests: a simulated agent on channels' communicator."""

import json
from dataclasses import dataclass

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.apps import apps
from django.db import connections

from agentd import protocol
from llmgw_site.asgi import application
from tests.factories import join_token, register_msg

db = database_sync_to_async


def run_closing_connections(fn, *args, **kwargs):
    """Call fn in this thread and close the thread's database connections after.

    For running sync code from a worker thread, as Celery or a management
    command would, without leaving connections open on the test database.
    """
    try:
        return fn(*args, **kwargs)
    finally:
        connections.close_all()


def communicator(secret: str | None = None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {secret}".encode())] if secret is not None else []
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


async def send(comm: WebsocketCommunicator, msg: dict) -> None:
    await comm.send_to(text_data=json.dumps(msg))


async def recv(comm: WebsocketCommunicator, timeout: float = 3) -> dict:
    """The next message from the control plane, checked against the schema."""
    out = await comm.receive_output(timeout)
    assert out["type"] == "websocket.send", f"expected a message, got {out}"
    protocol.parse_control_message(out["text"])  # what we send must be valid too
    return json.loads(out["text"])


async def recv_type(comm: WebsocketCommunicator, kind: str, timeout: float = 3) -> dict:
    """The next message of this type, skipping provision (sent at every registration)."""
    while True:
        msg = await recv(comm, timeout)
        if msg["type"] == kind:
            return msg
        assert msg["type"] == "provision", f"expected {kind}, got {msg}"


async def expect_close(comm: WebsocketCommunicator, timeout: float = 3) -> tuple[int, str]:
    """The server closes: returns (code, reason), then completes the close as Daphne would.

    A close the control plane decides is preceded by a `closing` message with the
    same code and the whole reason (Daphne drops the close frame's reason).
    """
    closing = None
    while True:
        out = await comm.receive_output(timeout)
        if out["type"] == "websocket.close":
            break
        assert out["type"] == "websocket.send", out
        msg = json.loads(out["text"])
        if msg["type"] == "closing":
            closing = msg
    code = out.get("code", 1000)
    frame_reason = out.get("reason") or ""
    # Daphne tells the application the socket is gone; the communicator must be told to.
    await comm.disconnect(code=code)
    if closing is None:
        assert code == 1000, f"closed with {code} without a closing message"
        return code, frame_reason
    assert closing["code"] == code, (closing, code)
    assert closing["reason"].startswith(frame_reason), (closing, frame_reason)
    return code, closing["reason"]


@dataclass
class Agent:
    comm: WebsocketCommunicator
    node_id: str
    credential: str
    register_ack: dict
    desired: dict

    async def send(self, msg: dict) -> None:
        await send(self.comm, msg)

    async def recv(self, timeout: float = 3) -> dict:
        return await recv(self.comm, timeout)

    async def recv_type(self, kind: str, timeout: float = 3) -> dict:
        return await recv_type(self.comm, kind, timeout)

    async def heartbeat(self, **fields) -> dict:
        """Send a heartbeat and wait for its ack (so it has been written)."""
        seq = fields.pop("seq", 1)
        await self.send({"type": "heartbeat", "v": 1, "seq": seq, **fields})
        ack = await self.recv_type("ack")
        assert ack["of"] == "heartbeat" and ack["seq"] == seq, ack
        return ack

    async def close(self) -> None:
        await self.comm.disconnect()


async def register(comm, node_id: str, **overrides) -> tuple[dict, dict]:
    """Register, returning the ack and the desired set that follows it."""
    await send(comm, register_msg(node_id, **overrides))
    ack = await recv_type(comm, "ack")
    assert ack["of"] == "register" and ack["node_id"] == node_id, ack
    desired = await recv_type(comm, "desired")
    return ack, desired


async def enrol(node_id: str = "gpu-01", **overrides) -> Agent:
    """A new node enrolled with a fresh join token, socket left open."""
    _, secret = await db(join_token)()
    comm = communicator(secret)
    connected, _ = await comm.connect()
    assert connected
    ack, desired = await register(comm, node_id, **overrides)
    assert ack["credential"]
    return Agent(comm, node_id, ack["credential"], ack, desired)


async def connect_as(credential: str, node_id: str, **overrides) -> Agent:
    """An enrolled node connecting again with its own credential."""
    comm = communicator(credential)
    connected, code = await comm.connect()
    assert connected, f"refused with {code}"
    ack, desired = await register(comm, node_id, **overrides)
    assert ack["credential"] is None
    return Agent(comm, node_id, credential, ack, desired)


def snapshot() -> dict:
    """Every row of every fleet table, to compare before and after."""
    out = {}
    for model in apps.get_app_config("fleet").get_models():
        out[model.__name__] = list(model.objects.order_by("pk").values())
    return out
