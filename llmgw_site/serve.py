"""The web process: the whole app (llmgw_site.asgi) on uvicorn, as `make run` and production run it.

    python -m llmgw_site.serve [--host 127.0.0.1] [--port 8000] [--workers 1]
                               [--forwarded-allow-ips ADDRS] [--graceful-timeout 30]
                               [--access-log]

One port serves everything: the admin and the console, the API, static files,
the agents' WebSocket, the gateway (/v1/*) and /metrics. uvicorn on uvloop and
httptools passes the gateway's requests with a fraction of Daphne's CPU and
without its tail latency (docs/gateway.md, "Serving"; docs/benchmarks.md).
Daphne serves it only under ``manage.py runserver``, in development.

What llmgw needs that uvicorn does not do by itself (some of it Daphne did), done here:

- The request head is bounded in time, lines and bytes, and framing is strict
  (``HeadLimitsProtocol``).
- Proxy headers are trusted only from the addresses ``--forwarded-allow-ips``
  names (``LLMGW_FORWARDED_ALLOW_IPS``), and the connection's own address is
  kept for the client-certificate check (``peer.py``).
- WebSocket messages are at most 1 MiB, pinged every 20 s, not compressed.
- SIGTERM: in-flight requests are given ``--graceful-timeout`` seconds, agent
  sockets are closed (1012, "service restart": agents reconnect), then the
  ASGI lifespan's shutdown writes the gateway's usage counts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import socket
import struct
import sys
import time

import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

logger = logging.getLogger(__name__)

# The headers' total size; a head over it is 431. Twisted (Daphne) bounds each
# line to 16 KiB; nginx's default buffers hold 32 KiB.
MAX_HEAD_BYTES = 64 << 10
# WebSocket limits, as Daphne's defaults were (docs/protocol.md).
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
# The agents' socket (fleet.routing), as the request line carries it.
AGENT_PATH = b"/ws/agent/"
# struct tcp_info (linux/tcp.h): 8 one-byte fields, then 32-bit ones; the twelfth
# of those, tcpi_last_data_recv, is at byte 52, and the struct is at least 104 bytes.
_TCP_INFO_LEN = 104
_LAST_DATA_RECV_AT = 52
# After refusing a head, how long the rest of what the client sends is drained.
LINGER_S = 2.0
# The garbage collector's young generation: collected after this many net
# allocations (Python's default is 700), and the middle one after this many
# young collections (default 10). Why: _tune_gc.
GC_YOUNG_ALLOCATIONS = 50_000
GC_MIDDLE_COLLECTIONS = 20


_limits: tuple[float, int] | None = None


def _head_limits() -> tuple[float, int]:
    global _limits
    if _limits is None:
        from fleet.conf import fleet_settings

        s = fleet_settings()
        _limits = (s.http_head_timeout_s, s.http_max_headers)
    return _limits


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


def queued_s(transport) -> float:
    """How long ago the client last sent data on this connection: for a request read
    just after the accept, how long it sat in the kernel's listen queue. Linux's
    TCP_INFO (``tcpi_last_data_recv``, in ms); 0 where there is none (a unix socket)."""
    sock = transport.get_extra_info("socket")
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except (AttributeError, OSError):
        return 0.0
    if len(info) < _TCP_INFO_LEN:
        return 0.0
    return struct.unpack_from("I", info, _LAST_DATA_RECV_AT)[0] / 1000


class HeadLimitsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the request head bounded and framing strict.

    - the whole head (first byte to blank line) within ``LLMGW_HTTP_HEAD_TIMEOUT_S``:
      past it 408 and the connection closed; uvicorn's own timer covers only
      the idle wait between requests, so a client sending a header line every
      few seconds would otherwise hold a connection for ever;
    - at most ``LLMGW_HTTP_MAX_HEADERS`` header lines (400) and ``MAX_HEAD_BYTES``
      (431): httptools accumulates a head without bound;
    - exactly one ``Transfer-Encoding`` line, ``chunked`` (400 otherwise);
      llhttp already refuses one beside ``Content-Length``.

    And an agent's WebSocket handshake the process should not take now is turned
    away before it is one (``_agent_turned_away``).
    """

    _head_timer: asyncio.TimerHandle | None = None
    _head_deadline = 0.0
    _head_open = False
    _head_bytes = 0
    _header_lines = 0
    _te_seen = False
    _refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        # An error raised by a callback below comes out of httptools as a parser
        # error, which uvicorn answers 400 and closes.
        super().data_received(data)
        if self._head_open and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, "Request Header Fields Too Large")
            elif self._head_timer is None:
                # Only a head that did not come whole in one read needs a clock: a
                # timer for every request would cost more than parsing its head.
                self._head_timer = self.loop.call_at(self._head_deadline, self._head_too_slow)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # Busy: a request read behind one the lane answered inside the parser's
        # callback (pipelined, in the same read) must not meet the idle timer.
        self._idle_since = None
        timeout, _ = _head_limits()
        self._head_open = True
        self._head_bytes = self._header_lines = 0
        self._te_seen = False
        self._cancel_head_timer()
        self._head_deadline = self.loop.time() + timeout

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_lines += 1
        if self._header_lines > _head_limits()[1]:
            raise ValueError(f"more than {_head_limits()[1]} header lines")
        if name.lower() == b"transfer-encoding":
            if self._te_seen or value.strip().lower() != b"chunked":
                raise ValueError("Transfer-Encoding other than one 'chunked'")
            self._te_seen = True
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._cancel_head_timer()
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not before and cycle.transport is self.transport:
            # A new request (not an upgrade): its task has not run yet.
            cycle.transport = _HeadWithBody(self.transport, self.loop)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        super().connection_lost(exc)

    # uvicorn arms a keep-alive timer after every answer and cancels it when the
    # next request's first bytes arrive: a timer made and unmade per request. Here
    # one timer stays armed while the connection is used; when it fires it looks
    # at how long the connection has been idle, and either closes it or waits for
    # the rest. (uvicorn 0.54's on_response_complete, otherwise unchanged.)

    _idle_since: float | None = None  # None: a request is being read or answered

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_due
            )

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        since = self._idle_since
        if since is None:
            return  # busy: armed again when its answer is done
        left = since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_due)
        else:
            self.timeout_keep_alive_handler()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self._head_open or self.transport.is_closing():
            return
        client = self.client or ("?", "?")
        logger.warning(
            "request head not complete in time; closing client=%s:%s", client[0], client[1]
        )
        self._refuse(408, "Request Timeout")

    def handle_websocket_upgrade(self) -> None:
        if self.url.partition(b"?")[0] == AGENT_PATH and self._agent_turned_away():
            return
        super().handle_websocket_upgrade()

    def _agent_turned_away(self) -> bool:
        """An agent's handshake this process should not take now: answered here, 503
        with Retry-After, before Channels and the consumer spend anything on it.

        Late: its request arrived ``admission.LATE_S`` or more before it was read
        (in the kernel's listen queue, or behind a loop too busy to read it), so
        its agent has little of its wait left, and the queue behind it is long.
        Busy: the sockets already between handshake and register are at the
        limit (the consumer checks it too, for Daphne and for the ones already
        past this point). Neither with the limit at 0 (admission off)."""
        gate = admission.admission()
        if not gate.limit:
            return False
        queued = queued_s(self.transport)
        if queued >= admission.LATE_S:
            kind, why = "late", f"waited {queued:.1f} s to be read"
        elif gate.full():
            kind, why = "busy", "too many agents registering at once"
        else:
            return False
        client = "%s:%s" % (self.client or ("?", "?"))
        after, told = admission.turn_away(gate, kind, why, client)
        body = f"{told}\n"
        self._refuse(
            503,
            "Service Unavailable",
            f"Retry-After: {after}\r\nContent-Type: text/plain; charset=utf-8\r\n",
            body,
        )
        return True

    def _refuse(self, status: int, reason: str, headers: str = "", body: str = "") -> None:
        self._refused = True
        self._head_open = False
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        self.transport.write(
            f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n{headers}"
            f"Content-Length: {len(body.encode())}\r\n\r\n{body}".encode()
        )
        # A lingering close: the answer, then our end of the stream; what the client
        # still sends is read and dropped for a moment. Closing at once would have
        # the kernel reset a connection with bytes in flight, and the client could
        # lose the answer before reading it.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


# The lane's paths (fleet.gateway.lane), as the request line carries them.
LANE_PATHS = {
    b"/v1/chat/completions": "chat/completions",
    b"/v1/completions": "completions",
    b"/v1/embeddings": "embeddings",
}


class LaneProtocol(HeadLimitsProtocol):
    """``HeadLimitsProtocol`` that serves the gateway's whole answers in the lane.

    A POST to one of ``LANE_PATHS`` (no query string), HTTP/1.1, with a
    Content-Length within the endpoint's limit and a key the lane may serve
    (``lane.key_for``: checked before the body is read), on a connection with
    nothing else in flight, is read into a ``lane.Exchange`` instead of an ASGI request
    cycle; the exchange answers it or hands it back (``lane_hand_over``) to
    run as uvicorn would have run it. Everything else is uvicorn's.
    """

    _lane_reading = None  # the exchange whose body is being read
    _lane = None  # the exchange being answered by the lane

    def on_headers_complete(self) -> None:
        if self._lane_open():
            self._head_open = False
            self._cancel_head_timer()
            return
        super().on_headers_complete()

    def _lane_open(self) -> bool:
        endpoint = LANE_PATHS.get(self.url)
        if endpoint is None or self.expect_100_continue or self.pipeline:
            return False
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return False
        parser = self.parser
        if (
            parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
            or self.access_log
        ):
            return False
        gw = gateway_of(self.loop)
        if gw is None or not gw.started:
            return False  # the first request starts it, through ASGI
        limit = gw.limits.max_body_bytes[endpoint]
        length = None
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                return False
        if length is None or not length.isdigit() or int(length) > limit:
            return False  # the ASGI path says what is wrong with it
        key = lane_key_for(gw, self.headers)
        if key is None:
            return False
        scope = self.scope
        scope["method"] = "POST"
        scope["path"] = self.url.decode("ascii")
        scope["raw_path"] = self.url
        scope["query_string"] = b""
        keep_alive = parser.should_keep_alive()
        exchange = Exchange(self, gw, key, endpoint, self.headers, scope, keep_alive)
        self.cycle = self._lane_reading = self._lane = exchange
        return True

    def on_body(self, body: bytes) -> None:
        exchange = self._lane_reading
        if exchange is not None:
            exchange.chunks.append(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        exchange = self._lane_reading
        if exchange is not None:
            self._lane_reading = None
            exchange.begin()
        else:
            super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        exchange = self._lane
        if exchange is not None:
            self._lane = None
            exchange.disconnected = True
            exchange.client_gone()
        super().connection_lost(exc)

    # ---- called by the exchange --------------------------------------------------

    def lane_answer(self, exchange, status: int, headers, body: bytes) -> bool:
        """The whole answer in one write, as uvicorn's cycle frames it; False if the
        client is gone."""
        if self._lane is not exchange:
            return False
        self._lane = None
        parts = [status_line(status)]
        for name, value in self.server_state.default_headers:
            parts += (name, b": ", value, b"\r\n")
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        keep_alive = exchange.keep_alive
        if not keep_alive:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", body)
        self.transport.write(b"".join(parts))
        exchange.response_complete = True
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()
        return True

    def lane_hand_over(self, exchange, before) -> bool:
        """Run the request through ASGI after all, its body already read, with what the
        lane did first (``proxy.Before``); False if the client is gone."""
        if self._lane is not exchange:
            return False
        self._lane = None
        scope = exchange.scope
        scope[LANE] = before
        cycle = RequestResponseCycle(
            scope=scope,
            transport=_HeadWithBody(self.transport, self.loop),
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=exchange.keep_alive,
            on_response=self.on_response_complete,
        )
        cycle.body = exchange.raw
        cycle.more_body = False
        cycle.message_event.set()  # the body is in: receive() has it at once
        if self.cycle is exchange:
            self.cycle = cycle
        self._start_asgi_task(cycle, self.app)
        return True


class _HeadWithBody:
    """A request's view of its connection that sends the response head with the body's first bytes.

    uvicorn writes the status line and headers as soon as the app sends
    ``http.response.start``, and the body with the next message: two writes, so
    two ``send`` calls, two TCP segments and two wake-ups of the client for
    every answer. The proxied answer sends both in the same pass of the event
    loop, so the head is held until the body follows and both go in one write
    (``writelines``). Whatever comes first, the body or the end of the loop's
    pass (``call_soon``), sends the head: an app that starts an answer and then
    waits (a stream whose first token is slow) still has its head sent at once.
    Writes after the first two go straight through.
    """

    __slots__ = ("_transport", "_held", "_handle")

    def __init__(self, transport, loop):
        self._transport = transport
        self._held = None
        self._handle = loop  # until the first write: the loop to schedule the flush on

    def write(self, data: bytes) -> None:
        handle = self._handle
        if handle is None:
            self._transport.write(data)
        elif self._held is None:
            self._held = data
            self._handle = handle.call_soon(self._flush)
        else:
            handle.cancel()
            self._handle = None
            held, self._held = self._held, None
            self._transport.writelines((held, data))

    def _flush(self) -> None:
        self._handle = None
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        if self._held is not None:
            self._handle.cancel()
            self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name):
        return getattr(self._transport, name)


# ---- the application, with the connection's own address kept --------------------


def _with_peer(app, trusted: str):
    """``app`` behind uvicorn's proxy-header handling for ``trusted``; the socket's own
    address kept in WebSocket scopes first (``peer.PEER_KEY``), as Daphne's does."""
    from llmgw_site.peer import PEER_KEY

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


# The lane's parts and the agents' admission: they import Django's models, so they
# come once Django is set up (_load_application), as module names the protocol
# finds without an import.
Exchange = status_line = gateway_of = LANE = lane_key_for = admission = None


def _bind_lane() -> None:
    global Exchange, status_line, gateway_of, LANE, lane_key_for, admission
    from fleet.gateway.app import LANE
    from fleet.gateway.lane import Exchange, status_line
    from fleet.gateway.lane import key_for as lane_key_for
    from fleet.gateway.state import gateway_of
    from fleet.services import admission


def _load_application():
    from llmgw_site.asgi import application as app  # sets Django up

    _bind_lane()
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
    p.add_argument("--access-log", action="store_true", help="log every request (off: as Daphne)")
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
    uvicorn.run(
        "llmgw_site.serve:application",
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="llmgw_site.serve:new_event_loop",
        http="llmgw_site.serve:LaneProtocol",
        ws="websockets-sansio",
        ws_max_size=WS_MAX_SIZE,
        ws_ping_interval=WS_PING_INTERVAL_S,
        ws_ping_timeout=WS_PING_TIMEOUT_S,
        # Agents send small JSON; per-connection zlib state costs memory and CPU
        # for thousands of sockets, and Daphne did not compress either.
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
