"""The lane: a whole (not streamed) proxied answer served by callbacks, outside ASGI.

Under ``llmgw_site.serve`` a POST to /v1/chat/completions, /v1/completions or
/v1/embeddings that needs nothing to wait on goes from the HTTP protocol's
parser callbacks to the engine and back with no ASGI scope, task, future or
timer of its own: the request is read by the protocol (``serve.LaneProtocol``),
admitted with the same checks as the ASGI app (``key_for`` before the body is
read, then ``validate.parse`` and ``app.admit``: the body, the model), written
to the replica the ASGI path would choose (an idle pooled connection; a connect
is the one task), and the engine's answer, once whole, is shaped as the ASGI
path shapes it (``proxy.whole_answer``) and written back in one ``send()``.
That is most of a gateway's CPU per short answer on uvicorn's ASGI path
(docs/gateway.md, "The lane").

Anything that would wait goes the ordinary way, through ASGI and
``fleet.gateway.app``, and nothing reaches the client before it does:

- at the start: the gateway not started yet, a key not in memory, refused, or
  with rate limits (Redis), a request that asks for a stream, a body too large
  to parse on the event loop (``validate.on_loop``), no ready replica (the
  request waits for one);
- on the way to the engine: every replica set aside (the 503 says why), a
  connect that failed, the pooled connection closed by the engine before any
  answer (sent again, as ``upstream.Client.post`` does), a 502/503 that another
  replica may answer (the failed replica counts as tried, and the total timeout
  keeps running: ``proxy.Before``), or an answer that is a stream (the engine
  is asked again through the ASGI path, which relays streams).

The deadlines (first byte, the whole exchange, silence inside a body) are
checked by one sweeping task per process while the lane has requests in
flight, not by timers per request; they fire within ``SWEEP_S`` of their time.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time

from . import metrics, proxy, validate
from .app import admit
from .errors import GatewayError, internal
from .upstream import ConnectFailed, Disconnected, NoAnswer, Refused, UpstreamError

logger = logging.getLogger(__name__)

# How often the deadlines of the lane's requests in flight are looked at.
SWEEP_S = 0.05
# A body naming "stream" may ask for one: the ASGI path reads it (a stream's cost
# is its tokens, not this). So does a body too large to parse on the event loop
# (validate.on_loop): the ASGI path parses it on the body thread.
_STREAM = b'"stream"'

STATUS_LINES = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in http.HTTPStatus
}


def status_line(status: int) -> bytes:
    return STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status


class _Inert:
    """What uvicorn's protocol sets on its current cycle when the connection ends."""

    __slots__ = ()

    def set(self) -> None:
        pass


class Exchange:
    """One request in the lane, from its body to the last byte of its answer.

    Stands in for uvicorn's request cycle while it is the connection's
    current one: ``response_complete``, ``keep_alive`` (cleared by a
    graceful shutdown), ``disconnected`` and ``message_event``.
    """

    __slots__ = (
        "conn",
        "gw",
        "endpoint",
        "headers",
        "scope",
        "keep_alive",
        "t0",
        "chunks",
        "response_complete",
        "disconnected",
        "begun",
        "key",
        "req",
        "route",
        "up",
        "how",
        "resp",
        "sent",
        "last_data",
        "connecting",
        "fresh",
    )

    message_event = _Inert()

    def __init__(self, conn, gw, key, endpoint: str, headers, scope, keep_alive: bool):
        self.conn = conn  # serve.LaneProtocol: lane_answer, lane_hand_over
        self.gw = gw
        self.key = key  # from key_for, before the body was read
        self.endpoint = endpoint
        self.headers = headers
        self.scope = scope
        self.keep_alive = keep_alive
        self.t0 = time.perf_counter()
        self.chunks: list[bytes] = []
        self.response_complete = False
        self.disconnected = False
        self.begun = False  # the body is in
        self.req = self.route = self.up = self.resp = None
        self.how = ""  # how the prompt's prefix chose the replica, if it did
        self.sent = 0.0  # time.monotonic() it went to the engine (a connect included)
        self.last_data = 0.0
        self.connecting: asyncio.Task | None = None
        self.fresh = False  # it went on a connection made for it

    @property
    def raw(self) -> bytes:
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # ---- the request -------------------------------------------------------------

    def begin(self) -> None:
        """The request's body is in: answer it, send it on, or hand it over."""
        self.begun = True
        gw = self.gw
        raw = self.raw
        try:
            if _STREAM in raw or not validate.on_loop(raw):
                return self._hand_over()
            req = validate.parse(self.endpoint, raw)
            route = admit(gw, self.key, req, self.t0)
            self.req, self.route = req, route
            if not route.upstreams:
                return self._hand_over()  # it waits for a replica
            up, how = proxy.choose(gw, route, proxy.ring_key(gw, route, req), ())
            if up is None:
                return self._hand_over()  # all set aside: the 503 says why
            proxy.check_capacity(route, up, gw.limits)
            body, _ = proxy.upstream_body(route, req, up)
            host, port = up.address
            head = up.request_head(self.endpoint)
            resp = gw.client.start(host, port, head, body)
        except GatewayError as exc:
            return self._error(exc)
        except Exception:
            return self._failed_here()
        up.outstanding += 1
        self.up, self.how = up, how
        if how:
            route.metrics.prefix_routed(how)
        self.sent = time.monotonic()
        if resp is not None:
            self._sent(resp)
        else:
            # No idle connection to this replica: a task for the connect alone.
            self.connecting = asyncio.get_running_loop().create_task(
                self._connect(host, port, head, body)
            )

    async def _connect(self, host: str, port: int, head: bytes, body: bytes) -> None:
        gw, route, up = self.gw, self.route, self.up
        first_byte_s = gw.limits.first_byte_timeout_s
        deadline = self.sent + first_byte_s if first_byte_s else 0.0
        try:
            resp = await gw.client.open_and_start(host, port, head, body, deadline)
        except ConnectFailed as exc:
            up.outstanding -= 1
            return self._retry(proxy.not_connected(gw, route, up, exc))
        except NoAnswer:
            up.outstanding -= 1
            return self._error(proxy.no_answer(gw, route, up))
        except Exception:
            up.outstanding -= 1
            return self._failed_here()
        except BaseException:
            up.outstanding -= 1  # cancelled: the client went away
            raise
        finally:
            self.connecting = None
        self.fresh = True
        self._sent(resp)

    def _sent(self, resp) -> None:
        self.resp = resp
        resp._max_body = self.gw.limits.upstream.max_body_bytes
        resp.listener = self._heard
        self.last_data = time.monotonic()
        follow(self.gw, self)

    # ---- the engine's answer --------------------------------------------------------

    def _heard(self) -> None:
        """Called by the connection after each read from the engine and when it closes."""
        resp = self.resp
        if resp is None:
            return
        try:
            if resp._error is not None:
                return self._failed(resp._error)
            status = resp.status
            if not status:
                return
            up = self.up
            up.connect_failures = 0  # it answered
            if status in (502, 503) and self._may_retry():
                self._let_go(reuse=False)
                return self._retry(proxy.unavailable(self.route, up, status))
            if status == 200 and resp.content_type == "text/event-stream":
                # A stream nobody asked for: asked again where streams are relayed.
                self._let_go(reuse=False)
                return self._hand_over()
            if resp.complete:
                return self._whole()
            self.last_data = time.monotonic()
            conn = resp._conn
            if conn.paused:
                conn.resume()  # the whole body is wanted, up to max_body_bytes
        except Exception:
            if self.resp is not None:
                self._let_go(reuse=False)
            self._failed_here()

    def _whole(self) -> None:
        resp, route, up = self.resp, self.route, self.up
        chunks = resp._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            status, body = proxy.whole_answer(route, up, resp, body)
        except GatewayError as exc:
            self._let_go(reuse=False)
            return self._error(exc)
        headers = proxy.whole_headers(up, resp, body)
        if status < 400:
            if validate.on_loop(body):
                proxy.tally(self.gw, route, self.key, proxy.usage_of(body))
            else:
                proxy.tally_later(self.gw, route, self.key, body)
        self._let_go(reuse=True)
        self._answer(status, headers, body)

    def _failed(self, exc: UpstreamError) -> None:
        route, up = self.route, self.up
        self._let_go(reuse=False)
        if not isinstance(exc, Disconnected):
            return self._error(proxy.broken_whole(route, up, exc))
        if self.fresh:
            return self._retry(proxy.dropped(route, up, exc))
        # The engine closed an idle pooled connection as the request went out:
        # nothing was answered, so it is sent again, on a new connection.
        self._hand_over()

    def _may_retry(self) -> bool:
        return self.gw.limits.max_retries > 0 and len(self.route.upstreams) > 1

    def _retry(self, why: str) -> None:
        """This replica failed before answering: the ASGI path tries the others."""
        proxy.log_retry(self.route, self.up, 1, why)
        self._hand_over([self.up], why)

    def _hand_over(self, tried=(), why: str = "") -> None:
        before = proxy.Before(self.t0, list(tried), why, self.sent, bool(self.how))
        if self.conn.lane_hand_over(self, before):
            metrics.LANE_HANDED_OVER.inc()

    def expire(self, now: float) -> bool:
        """Fail the exchange if one of its deadlines has passed; whether it did."""
        limits = self.gw.limits
        resp = self.resp
        if resp is None:
            return False
        if self.sent + limits.total_timeout_s <= now:
            error = proxy.too_slow(self.gw, self.route)
        elif not resp.status:
            if not limits.first_byte_timeout_s or self.sent + limits.first_byte_timeout_s > now:
                return False
            error = proxy.no_answer(self.gw, self.route, self.up)
        elif self.last_data + limits.upstream.idle_s <= now:
            silent = f"the engine sent nothing for {limits.upstream.idle_s:g} s"
            error = proxy.refused(self.route, self.up, Refused(silent, "upstream_timeout"))
        else:
            return False
        self._let_go(reuse=False)
        self._error(error)
        return True

    def _let_go(self, reuse: bool) -> None:
        """Done with the engine: its connection back to the pool, or closed (which tells
        an engine still generating to stop)."""
        resp, self.resp = self.resp, None
        resp.listener = None
        if reuse:
            resp.release()
        else:
            resp.close()
        self.up.outstanding -= 1
        self.gw.lane.pop(self, None)

    # ---- the client -----------------------------------------------------------------

    def client_gone(self) -> None:
        """The client's connection closed before its answer."""
        if self.connecting is not None:
            self.connecting.cancel()
        elif self.resp is not None:
            self._let_go(reuse=False)
        elif self.begun:
            return  # answered or handed over
        if self.route is not None:
            logger.info(
                "client went away; upstream request cancelled model=%s started=False",
                self.route.name,
            )
        self._count(499)  # nginx's word for it: nobody was left to answer

    def _failed_here(self) -> None:
        """A bug, not the client's doing: logged with its traceback, answered in OpenAI's shape."""
        logger.exception("gateway failed on POST /v1/%s", self.endpoint)
        self._error(internal())

    def _error(self, exc: GatewayError) -> None:
        headers, body = exc.answer()
        self._answer(exc.status, headers, body)

    def _answer(self, status: int, headers, body: bytes) -> None:
        if self.conn.lane_answer(self, status, headers, body):
            metrics.LANE_SERVED.inc()
            self._count(status)

    def _count(self, status: int) -> None:
        route = self.route
        if route is None:
            metrics.count_unrouted(status)
        else:
            route.metrics.count(status)
            route.metrics.latency.observe(time.perf_counter() - self.t0)


def key_for(gw, headers):
    """The request's key if the lane may serve it: known to this process, valid, and
    without limits (they are counted in Redis). Otherwise None: the ASGI path then
    reloads the keys, or refuses the request, before it reads the body."""
    try:
        key = gw.known_key(headers)
    except GatewayError:
        return None
    return None if key is None or key.limits.on else key


def follow(gw, exchange: Exchange) -> None:
    """Keep ``exchange`` under the deadline sweep until it lets go of its engine."""
    gw.lane[exchange] = None
    if gw.lane_sweeper is None and gw.started:  # none after the gateway's close
        gw.lane_sweeper = asyncio.get_running_loop().create_task(_sweep(gw))


async def _sweep(gw) -> None:
    """Fail the lane's requests whose deadlines have passed, every ``SWEEP_S``.

    Requests are kept in the order they went to the engine; only those older
    than the shortest deadline are looked at one by one.
    """
    inflight = gw.lane
    try:
        while inflight:
            await asyncio.sleep(SWEEP_S)
            limits = gw.limits
            window = min(
                limits.first_byte_timeout_s or limits.total_timeout_s,
                limits.total_timeout_s,
                limits.upstream.idle_s,
            )
            now = time.monotonic()
            old = []
            for exchange in inflight:
                if exchange.sent + window > now:
                    break
                old.append(exchange)
            for exchange in old:
                exchange.expire(now)
    finally:
        gw.lane_sweeper = None
