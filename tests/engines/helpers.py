"""Helpers for the engine and supervisor tests: shard specs, a supervisor that records events."""

from __future__ import annotations

import asyncio
import stat
import sys
import time
from pathlib import Path

from agentd import protocol
from agentd.supervisor import Supervisor
from tests.processes import port_block

H100_UUIDS = [
    "GPU-5f1c8a2e-0000-4b7d-9e2a-3c6f0d1b0000",
    "GPU-5f1c8a2e-0001-4b7d-9e2a-3c6f0d1b0001",
]


def profile(engine="fake", **fields) -> protocol.ProfileSpec:
    return protocol.ProfileSpec(
        name=fields.pop("name", f"{engine}-default"), engine=engine, **fields
    )


def shard(
    shard_id="r1-s0", engine="fake", state="running", args=(), port=0, **fields
) -> protocol.DesiredShard:
    prof = fields.pop("profile", None) or profile(engine, args=list(args))
    return protocol.DesiredShard(
        shard_id=shard_id,
        replica_id=fields.pop("replica_id", "r1"),
        model=fields.pop("model", "tiny-llama"),
        state=state,
        port=port,
        profile=prof,
        **fields,
    )


def desired(version: int, *shards: protocol.DesiredShard) -> protocol.Desired:
    return protocol.Desired(type="desired", version=version, shards=list(shards))


def stub_binary(directory: Path, name: str, script: str) -> str:
    """An executable shell script standing in for an engine's CLI where none is installed."""
    path = directory / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


class Recorder:
    """Collects what the supervisor reports, and waits for a shard to reach a state."""

    def __init__(self):
        self.events: list = []
        self._changed = asyncio.Event()

    async def __call__(self, msg) -> None:
        self.events.append(msg)
        self._changed.set()

    def states(self, shard_id: str) -> list[str]:
        return [e.state for e in self.events if e.type == "shard_status" and e.shard_id == shard_id]

    def last(self, shard_id: str, state: str | None = None, after: int = 0):
        for e in reversed(self.events[after:]):
            if e.type == "shard_status" and e.shard_id == shard_id:
                if state is None or e.state == state:
                    return e
        return None

    async def wait_for(
        self, shard_id: str, state: str, timeout: float = 20, after: int = 0
    ) -> protocol.ShardStatus:
        """The latest report of that state, waiting for one; ``after``: among events from there."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.last(shard_id, state, after)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"shard {shard_id} never became {state}; it went {self.states(shard_id)}"
                )
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                pass


async def adapters_reported(rec: Recorder, check, timeout: float = 20) -> dict:
    """The newest report of the shard's adapters (name -> state) once ``check`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        for e in reversed(rec.events):
            if e.type == "shard_status" and e.adapters:
                held = {a.name: a.state for a in e.adapters}
                if check(held):
                    return held
                break
        assert asyncio.get_running_loop().time() < deadline, rec.events[-3:]
        await asyncio.sleep(0.05)


def fake_supervisor(state_dir: Path, recorder: Recorder | None = None, **kwargs) -> Supervisor:
    """A supervisor that may run the fake engine, with short timings for tests; local
    model paths under the state dir's parent (the test's tmp_path)."""
    if "port_range" not in kwargs:
        kwargs["port_range"] = port_block(20)
    kwargs.setdefault("binaries", {"fake": sys.executable})
    kwargs.setdefault("stop_grace_s", 2)
    kwargs.setdefault("drain_timeout_s", 5)
    kwargs.setdefault("host", "127.0.0.1")
    # Local model paths only under the test's own tmp tree (agentd.localpaths).
    kwargs.setdefault("model_dirs", [Path(state_dir).resolve().parent])
    return Supervisor(state_dir, on_event=recorder, **kwargs)


async def http_post(port: int, path: str, payload: dict, timeout: float = 60) -> tuple[int, bytes]:
    """A bare HTTP/1.0 POST of JSON: status and body (the agent itself carries no HTTP client)."""
    import json

    body = json.dumps(payload).encode()
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        data = await reader.read()
        writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest
