"""The web process: the whole app (llmgw_site.asgi) on uvicorn, as `make run` and production run it.

    python -m llmgw_site.serve [--host 127.0.0.1] [--port 8000] [--workers 1]
                               [--forwarded-allow-ips ADDRS] [--graceful-timeout 30]
                               [--backlog 8192] [--access-log]

One port serves everything: the admin and the console, the API, static files,
the agents' WebSocket, the gateway (/v1/*) and /metrics, on uvicorn's uvloop
loop and httptools parser, through uvicorn's public options (``uvicorn.run``).
In front of clients it needs the load balancer of docs/scaling.md, which bounds
each connection (a head's time and size, an idle keep-alive, a slow body); the
process itself bounds what the app reads (docs/security.md). Daphne serves the
app only under ``manage.py runserver``, in development.

What llmgw adds to uvicorn, each with public interfaces only:

- Proxy headers are trusted only from the addresses ``--forwarded-allow-ips``
  names (``LLMGW_FORWARDED_ALLOW_IPS``; uvicorn's ``ProxyHeadersMiddleware``),
  and the connection's own address is kept first for the client-certificate
  check (``peer.py``).
- WebSocket messages are at most 1 MiB, pinged every 20 s, not compressed.
- The listen queue is taken a batch a turn of the loop (``_Acceptor``), so a
  fleet reconnecting after a restart is taken at the pace the app registers.
- The garbage collector is set for a process holding thousands of sockets.
- SIGTERM: in-flight requests are given ``--graceful-timeout`` seconds, agent
  sockets are closed (1012, "service restart": agents reconnect), then the
  ASGI lifespan's shutdown writes the gateway's usage counts.

``UVICORN_CHECKED`` names the uvicorn release these were checked against; a test
fails when requirements.txt pins another, so an upgrade is looked at here first.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import socket
import sys
import time

import uvloop

logger = logging.getLogger(__name__)

UVICORN_CHECKED = "0.54.0"
# WebSocket limits (docs/protocol.md).
WS_MAX_SIZE = 1 << 20
WS_PING_INTERVAL_S = 20.0
WS_PING_TIMEOUT_S = 20.0
# Longer than a load balancer keeps an idle connection to a backend (HAProxy's
# `timeout server` in docs/scaling.md is 60 s), so the balancer, not this
# process, closes idle connections: otherwise a request can cross a close.
KEEP_ALIVE_S = 65
# uvicorn's default is 2,048. After a restart the whole fleet knocks within
# seconds; past the queue the kernel drops the SYNs, and an agent whose SYN is
# dropped three times runs out its 10 s handshake wait and backs off for up to
# 30 s (docs/benchmarks.md, Agent sockets). Linux caps it at net.core.somaxconn
# (4,096 by default since 5.4).
LISTEN_BACKLOG = 8192
ENV_TRUSTED = "LLMGW_FORWARDED_ALLOW_IPS"
# Connections taken out of the listen queue in one turn of the event loop: a
# fleet's wave in a second or so, and with --workers, no one process taking it all.
ACCEPT_BATCH = 128
# Out of descriptors, the listen queue is left alone this long (asyncio's delay).
ACCEPT_PAUSE_S = 1.0
# The garbage collector's young generation: collected after this many net
# allocations (Python's default is 700), and the middle one after this many
# young collections (default 10). Why: _tune_gc.
GC_YOUNG_ALLOCATIONS = 50_000
GC_MIDDLE_COLLECTIONS = 20


class _Acceptor:
    """Accepts what is in a listening socket's queue, up to ``ACCEPT_BATCH`` at a time.

    libuv (under uvloop) accepts one connection per turn of the event loop since
    1.45 ("unix: don't accept() connections in a loop"). A loop busy registering a
    fleet takes tens of milliseconds a turn, so it took 100-300 connections a
    second out of a queue of 4,000 while the agents at its tail ran out their 10 s
    (docs/benchmarks.md, "One connection a turn"). This watches a duplicate of
    the listening socket and takes the queue a batch a turn, as asyncio's own
    loop does; uvloop's one-a-turn accept goes on beside it.
    """

    def __init__(self, loop, listening, protocol_factory, tls: dict):
        self.loop, self.protocol_factory, self.tls = loop, protocol_factory, tls
        self.sock = socket.socket(fileno=os.dup(listening.fileno()))
        self.sock.setblocking(False)
        self.serving: set[asyncio.Task] = set()
        self.closed = False
        self.paused_at = 0.0
        loop.add_reader(self.sock, self._drain)

    def _drain(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # reset by its client while it waited: nothing to serve
            except OSError as exc:
                self._pause(exc)
                return
            task = self.loop.create_task(self._serve(conn))
            self.serving.add(task)
            task.add_done_callback(self.serving.discard)

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors or memory (EMFILE, ENOBUFS): the socket stays readable,
        so stop watching it for a second, as asyncio's loop does; uvloop's own
        accept sheds load meanwhile."""
        self.loop.remove_reader(self.sock)
        now = time.monotonic()
        if now - self.paused_at > 60:
            logger.warning("accepting failed, paused %g s (once a minute): %s", ACCEPT_PAUSE_S, exc)
        self.paused_at = now
        self.loop.call_later(ACCEPT_PAUSE_S, self._resume)

    def _resume(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.sock, self._drain)

    async def _serve(self, conn: socket.socket) -> None:
        if self.closed:
            conn.close()
            return
        try:
            transport, protocol = await self.loop.connect_accepted_socket(
                self.protocol_factory, conn, **self.tls
            )
        except BaseException:
            conn.close()  # gone before it was served, or the process is stopping
            raise
        if self.closed:
            # Accepted in the turn the server was closed in: it missed the server's
            # round of shutdowns (uvicorn's Server.shutdown), so it gets its own.
            shutdown = getattr(protocol, "shutdown", None)
            if shutdown is not None:
                shutdown()
            else:
                transport.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.sock)
        self.sock.close()


class _Server:
    """The loop's server, whose ``close`` stops the acceptors first: a stopping
    process takes no new connection, whichever watcher would have taken it."""

    def __init__(self, server, acceptors: list[_Acceptor]):
        self._server, self._acceptors = server, acceptors

    def close(self) -> None:
        for acceptor in self._acceptors:
            acceptor.close()
        self._server.close()

    async def serve_forever(self) -> None:
        try:
            await self._server.serve_forever()
        finally:
            self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()
        await self._server.wait_closed()

    def __getattr__(self, name):
        return getattr(self._server, name)


class _Loop(uvloop.Loop):
    async def create_server(self, protocol_factory, *args, **kwargs):
        server = await super().create_server(protocol_factory, *args, **kwargs)
        if kwargs.get("start_serving") is False:
            return server  # not uvicorn's: served as uvloop serves it
        tls = {}
        if kwargs.get("ssl") is not None:
            tls = {k: kwargs[k] for k in _TLS_KWARGS if kwargs.get(k) is not None}
        acceptors = [
            _Acceptor(self, sock, protocol_factory, tls)
            for sock in server.sockets
            if sock.family in (socket.AF_INET, socket.AF_INET6)
        ]
        return _Server(server, acceptors)


_TLS_KWARGS = ("ssl", "ssl_handshake_timeout", "ssl_shutdown_timeout")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The web process's event loop (uvicorn's ``loop``): uvloop's, taking a queue
    of connections in one turn (``_Acceptor``)."""
    return _Loop()


# ---- the application, with the connection's own address kept --------------------


def _with_peer(app, trusted: str):
    """``app`` behind uvicorn's proxy-header handling for ``trusted``; the socket's own
    address kept in WebSocket scopes first (``peer.PEER_KEY``)."""
    from fleet.sockets.peer import PEER_KEY

    inner = app
    if trusted:
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        inner = ProxyHeadersMiddleware(app, trusted_hosts=trusted)

    async def application(scope, receive, send):
        if scope["type"] == "websocket" and (client := scope.get("client")):
            scope["extensions"] = {**(scope.get("extensions") or {}), PEER_KEY: client[0]}
        return await inner(scope, receive, send)

    return application


def _tune_gc() -> None:
    """The cyclic garbage collector, set for a process holding thousands of sockets.

    What was loaded to get here (130,000 objects) lives as long as the process:
    frozen, full collections have only the rest to walk (154 ms → 0.004 ms).
    Under Python's default young generation (700 allocations) anything alive a
    few milliseconds (a heartbeat waiting for its batch, a request waiting on
    its engine) ages into the old generation and sets off full collections,
    each a walk over every socket's objects: 0.6-0.8 s every 20-30 s with
    5,000 agents, every socket and request stopped meanwhile. At 50,000 they
    are freed before they age (docs/benchmarks.md, "A full collection every 25 s").
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_ALLOCATIONS, GC_MIDDLE_COLLECTIONS, gc.get_threshold()[2])
    from fleet.metrics import GC_FULL_PAUSE

    # A --workers process runs this module twice (as itself, and as __mp_main__
    # when multiprocessing spawns it): one callback, or each pause counts twice.
    if any(getattr(cb, "llmgw_gc_timer", False) for cb in gc.callbacks):
        return
    GC_FULL_PAUSE.enable()
    started = [0.0]

    def timed(phase: str, info: dict) -> None:
        # No locks in here (fleet.metrics.FullCollections says why).
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            GC_FULL_PAUSE.observe(time.perf_counter() - started[0])

    timed.llmgw_gc_timer = True
    gc.callbacks.append(timed)


def _load_application():
    from llmgw_site.asgi import application as app  # sets Django up

    _tune_gc()
    return _with_peer(app, os.environ.get(ENV_TRUSTED, "").strip())


application = _load_application() if __name__ != "__main__" else None


# ---- the command ------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m llmgw_site.serve",
        description="Serve llmgw (admin, API, agents' sockets, gateway) on uvicorn.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes sharing the port (default 1; or one process per core behind a balancer)",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        default=os.environ.get(ENV_TRUSTED, ""),
        metavar="ADDRS",
        help="comma-separated addresses or networks of the proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto are trusted ('*': any); default none: the headers are ignored",
    )
    p.add_argument(
        "--graceful-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, how long requests in flight may finish (default 30)",
    )
    p.add_argument(
        "--backlog",
        type=int,
        default=LISTEN_BACKLOG,
        metavar="N",
        help=f"connections the kernel queues before they are accepted (default {LISTEN_BACKLOG}; "
        "the kernel caps it at net.core.somaxconn)",
    )
    p.add_argument("--access-log", action="store_true", help="log every request (default off)")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be 1 or more, not {args.workers}")
    if not 0 < args.port < 65536:
        p.error(f"--port must be 1-65535, not {args.port}")
    if args.backlog < 1:
        p.error(f"--backlog must be 1 or more, not {args.backlog}")
    if args.graceful_timeout <= 0:
        p.error(f"--graceful-timeout must be positive, not {args.graceful_timeout:g}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import uvicorn

    # Read by every worker as it imports this module (they are spawned, not forked).
    os.environ[ENV_TRUSTED] = args.forwarded_allow_ips.strip()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    # Once, here: a worker refusing to start would be started again and again.
    import django

    django.setup()
    from llmgw_site.startup import refusal

    if (why := refusal()) is not None:
        print(f"llmgw: not starting: {why}", file=sys.stderr)
        return 2
    uvicorn.run(
        "llmgw_site.serve:application",
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="llmgw_site.serve:new_event_loop",
        http="httptools",
        ws="websockets-sansio",
        ws_max_size=WS_MAX_SIZE,
        ws_ping_interval=WS_PING_INTERVAL_S,
        ws_ping_timeout=WS_PING_TIMEOUT_S,
        # Agents send small JSON; per-connection zlib state costs memory and CPU
        # for thousands of sockets.
        ws_per_message_deflate=False,
        lifespan="on",
        proxy_headers=False,  # done by the app, after keeping the socket's own address
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=args.graceful_timeout,
        backlog=args.backlog,
        access_log=args.access_log,
        log_config=None,  # Django's LOGGING (llmgw_site/settings.py) governs every logger
        server_header=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
