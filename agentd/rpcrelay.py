"""Let only the leader reach a follower's ggml-rpc-server: a relay in front of it.

``python agentd/rpcrelay.py --host ADDR --port PORT --allow LEADER -- COMMAND ... {port} ...``

ggml-rpc-server has no authentication: whoever reaches its address may put
tensors in its memory and run graphs on its devices (llama.cpp's
tools/rpc/README.md: never on an open network). So a multi-node llama.cpp
follower runs it on 127.0.0.1, on a free port put where ``{port}`` stands in
COMMAND, and this relay listens on the node's management address and the shard's
port instead: a connection from an address ``--allow`` names (the leader's) is
relayed byte for byte to the rpc-server; any other is closed at once (a reset)
and logged, the first from each address and every 100th after.

The relay is the shard's process, the group leader the agent started, with the
rpc-server its child: it outlives the agent as engines do, and the rpc-server
dies with it (PR_SET_PDEATHSIG). It listens only once the rpc-server does, so
the leader's wait (rpcwait.py) sees a server that answers. It ends as the
rpc-server ends (its exit status, or its signal). Its cost in tokens/s is in
docs/benchmarks.md.

Standard library only, run by its path: engines start without the agent's
import path.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import ipaddress
import os
import signal
import socket
import sys
import time

READY_POLL_S = 0.1
LOG_EVERY = 100  # refusals from one address: the first is logged, then every 100th
PR_SET_PDEATHSIG = 1
START_TRIES = 3


def log(text: str) -> None:
    print(f"llmgw rpc relay: {text}", flush=True)


def address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP literal as a peer or the leader names it ([::1], fe80::1%eth0, ::ffff:10.0.0.1)."""
    ip = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the rpc-server, before it runs: SIGKILL when the relay goes, however it goes."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Side(asyncio.Protocol):
    """One connection of a relayed pair: what it receives is written to the other.

    Protocols rather than streams: a byte goes from one socket to the other in the
    callback that read it, with no task in between, which halved the relay's cost in
    tokens/s (docs/benchmarks.md). Back-pressure crosses over: while one side's
    writes wait, the other side is not read.
    """

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.other: Side | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.other.transport.write(data)

    def eof_received(self) -> bool:
        return False  # one side done: close it, and the other follows (connection_lost)

    def connection_lost(self, exc) -> None:
        if self.other is not None:
            self.other.transport.close()

    def pause_writing(self) -> None:
        self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        self.other.transport.resume_reading()


class Front(Side):
    """A connection to the relay's port: the leader's is joined to a new connection to
    the rpc-server; any other peer's is closed at once, before a byte is read."""

    def __init__(self, relay: Relay):
        super().__init__()
        self.relay = relay

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername") or ("?", 0)
        if not self.relay.allows(peer[0]):
            transport.abort()
            self.relay.refused(peer)
            return
        transport.pause_reading()  # until the rpc-server's side is there to take it
        self.relay.spawn(self._join())

    async def _join(self) -> None:
        loop = asyncio.get_running_loop()
        back = Side()
        try:
            await loop.create_connection(lambda: back, "127.0.0.1", self.relay.backend_port)
        except OSError as exc:
            log(f"rpc-server on 127.0.0.1:{self.relay.backend_port} refused the leader: {exc}")
            self.transport.abort()
            return
        if self.transport.is_closing() or back.transport.is_closing():
            back.transport.close()  # either end went while the other was reached
            self.transport.close()
            return
        self.other, back.other = back, self
        self.transport.resume_reading()


class Relay:
    def __init__(self, allowed: set, backend_port: int):
        self.allowed = allowed
        self.backend_port = backend_port
        self.seen: collections.Counter[str] = collections.Counter()
        self.who = ", ".join(sorted(str(a) for a in allowed))
        self.tasks: set[asyncio.Task] = set()

    def allows(self, host: str) -> bool:
        try:
            return address(host) in self.allowed
        except ValueError:
            return False

    def refused(self, peer) -> None:
        host = str(peer[0])
        self.seen[host] += 1
        n = self.seen[host]
        if n == 1 or n % LOG_EVERY == 0:
            times = "" if n == 1 else f" ({n} times so far)"
            log(f"refused a connection from {host}:{peer[1]}{times}: only {self.who} may connect")

    def spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)  # held: the loop keeps only weak references to tasks
        task.add_done_callback(self.tasks.discard)


async def _listens(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


class Ended(Exception):
    """The rpc-server ended before it listened; ``code`` is what the relay exits with."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


async def start(command: list[str], ready_s: float):
    """The rpc-server on a free loopback port, once it listens: (process, its wait, port),
    or Ended. The port comes from the kernel's ephemeral range, where an outgoing
    connection may take it before the rpc-server binds it: a server that exits before
    it listens is started again on another, twice."""
    loop = asyncio.get_running_loop()
    code = 1
    for _ in range(START_TRIES):
        backend = free_loopback_port()
        argv = [part.replace("{port}", str(backend)) for part in command]
        child = await asyncio.create_subprocess_exec(*argv, preexec_fn=_die_with_parent)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, child.send_signal, sig)
        waited = asyncio.ensure_future(child.wait())
        deadline = time.monotonic() + ready_s
        while not waited.done() and not await _listens(backend):
            if time.monotonic() > deadline:
                log(f"{argv[0]} did not listen on 127.0.0.1:{backend} within {ready_s:g} s")
                child.kill()
                await waited
                raise Ended(1)
            await asyncio.sleep(READY_POLL_S)
        if not waited.done():
            return child, waited, backend
        code = waited.result()
        if code < 0:
            raise Ended(code)  # killed: not a port taken meanwhile
        log(f"{argv[0]} exited with {code} before it listened on 127.0.0.1:{backend}")
    raise Ended(code)


async def run(host: str, port: int, allowed: set, command: list[str], ready_s: float) -> int:
    try:
        child, waited, backend = await start(command, ready_s)
    except Ended as ended:
        return ended.code
    relay = Relay(allowed, backend)
    try:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Front(relay), host, port, reuse_address=True)
    except OSError as exc:
        log(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        child.kill()
        await waited
        return 1
    log(f"listening on {host}:{port} for {relay.who}; rpc-server on 127.0.0.1:{backend}")
    try:
        return await waited
    finally:
        server.close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: rpcrelay.py --host A --port P --allow LEADER -- COMMAND", file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="rpcrelay.py")
    parser.add_argument("--host", required=True, help="the address the leader connects to")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--allow", action="append", required=True, help="the leader's address")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command:
        print("rpcrelay: no command after --", file=sys.stderr)
        return 2
    try:
        allowed = {address(a) for a in args.allow}
    except ValueError as exc:
        print(f"rpcrelay: --allow must be an IP address: {exc}", file=sys.stderr)
        return 2
    code = asyncio.run(run(args.host, args.port, allowed, command, args.ready_timeout))
    if code < 0:
        # The rpc-server was killed: end the same way, so the agent reports the signal.
        with contextlib.suppress(OSError):  # SIGKILL and SIGSTOP have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
