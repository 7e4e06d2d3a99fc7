"""A small keep-alive HTTP/1.1 client for the request path: POST to a replica, stream the answer.

aiohttp's client spent more CPU per proxied request than the rest of the
gateway together (docs/benchmarks.md, Gateway). This does only what the
gateway needs — one request at a time per pooled connection, bodies with a
Content-Length, chunked or read to the close, no redirects, cookies,
compression or proxies — on an asyncio protocol with httptools, the parser
uvicorn uses.

What the caller learns, and when:
- ``ConnectFailed``: no connection could be made (refused, unreachable, timed out).
- ``Disconnected``: the connection closed before the status line; nothing was
  answered, so another replica may take the request.
- ``Incomplete``: the connection closed, or sent something that is not HTTP,
  after the answer began.
- ``Refused``: the engine's answer broke a bound (``ReadLimits``: headers too
  many or too large, a body too large, too long a silence) or switched
  protocols. The connection is closed, never reused.

Everything read from an engine is bounded before it is kept (docs/gateway.md,
"Bounds on what engines send"). A complete answer ends the exchange: bytes
after it mean the engine and the gateway disagree on where answers end, so the
connection is closed rather than handed back, and those bytes never reach
anybody.
"""

import asyncio
import time
from dataclasses import dataclass

import httptools

# Read no further ahead of a slow client than this: the engine waits instead.
_HIGH_WATER = 256 * 1024
_IDLE_S = 30.0  # a pooled connection unused for longer is closed, not reused


@dataclass(frozen=True)
class ReadLimits:
    """How much the client accepts from an engine, and how long it waits between bytes."""

    max_header_bytes: int = 64 << 10  # status line, headers and trailers together
    max_headers: int = 100  # header lines, trailers included
    max_body_bytes: int = 64 << 20  # an answer read whole (``read()``); streams are not held
    idle_s: float = 60.0  # silence allowed while a body is awaited


class UpstreamError(Exception):
    pass


class ConnectFailed(UpstreamError):
    pass


class Disconnected(UpstreamError):
    pass


class Incomplete(UpstreamError):
    pass


class NoAnswer(TimeoutError):
    """No status line within the time ``post`` was given: the engine took the request and
    said nothing (its process frozen, its node cut off)."""


class Refused(UpstreamError):
    """The answer broke a bound or is not HTTP the gateway speaks; ``code`` says which."""

    def __init__(self, message: str, code: str = "upstream_too_large"):
        super().__init__(message)
        self.code = code


def _too_large(limit: int) -> Refused:
    return Refused(f"the answer is over {limit} bytes, the most the gateway reads whole")


class _Abort(Exception):
    """Raised inside a parser callback to stop parsing at once."""


class Response:
    """One answer. ``release()`` after reading it all hands the connection back for reuse."""

    __slots__ = (
        "_conn",
        "status",
        "reason",
        "_headers",
        "_chunks",
        "_buffered",
        "_waiter",
        "complete",
        "_error",
        "_to_eof",
        "_keep_alive",
        "_received",
        "_max_body",
        "_head_bytes",
        "_head_count",
    )

    def __init__(self, conn):
        self._conn = conn
        self.status = 0
        self.reason = ""
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future | None = None
        self.complete = False
        self._error: UpstreamError | None = None
        self._to_eof = False  # neither a length nor chunks: the body ends with the connection
        self._keep_alive = False
        self._received = 0  # body bytes so far
        self._max_body: int | None = None  # set by read(): a whole answer is bounded
        self._head_bytes = 0  # status lines, headers and trailers, interim answers included
        self._head_count = 0

    def header(self, name: bytes) -> str | None:
        for key, value in self._headers:
            if key == name:
                return value.decode("latin-1")
        return None

    @property
    def content_type(self) -> str:
        value = self.header(b"content-type") or ""
        return value.split(";", 1)[0].strip().lower()

    # ---- reading -----------------------------------------------------------------

    async def _wait(self, idle_s: float = 0.0, late=None) -> None:
        loop = self._conn.loop
        self._waiter = loop.create_future()
        timer = loop.call_later(idle_s, late or self._stalled, idle_s) if idle_s else None
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _no_answer(self, wait_s: float) -> None:
        self._fail(NoAnswer(f"no answer within {wait_s:g} s"))

    def _stalled(self, idle_s: float) -> None:
        self._fail(Refused(f"the engine sent nothing for {idle_s:g} s", "upstream_timeout"))
        self._conn.abort()

    async def iter_chunks(self):
        """The body as it arrives, never more than what is there."""
        while True:
            if self._chunks:
                chunks, self._chunks = self._chunks, []
                self._buffered = 0
                self._conn.resume()
                yield chunks[0] if len(chunks) == 1 else b"".join(chunks)
            elif self.complete:
                return
            elif self._error is not None:
                raise self._error
            else:
                await self._wait(self._conn.limits.idle_s)

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; ``Refused`` past ``limit`` bytes (the client's ``max_body_bytes``)."""
        limit = self._conn.limits.max_body_bytes if limit is None else limit
        self._max_body = limit
        declared = self.header(b"content-length")
        if (declared is not None and declared.strip().isdigit() and int(declared) > limit) or (
            self._received > limit
        ):
            self._conn.abort()
            raise _too_large(limit)
        idle_s = self._conn.limits.idle_s
        # A loop of its own, not over iter_chunks: an async generator costs more per answer.
        while not self.complete:
            if self._error is not None:
                raise self._error
            if self._buffered > _HIGH_WATER // 2:
                self._conn.resume()  # a whole body is wanted, up to the limit
            await self._wait(idle_s)
        if self._error is not None:
            raise self._error
        chunks = self._chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def release(self) -> None:
        self._conn.done(reuse=self.complete)

    def close(self) -> None:
        """Drop the connection: an engine stops generating for a client that went away."""
        self._conn.done(reuse=False)

    # ---- fed by the connection ---------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: UpstreamError) -> None:
        if self._error is None and not self.complete:
            self._error = exc
            self._wake()


class _Conn(asyncio.Protocol):
    def __init__(self, pool: "_Pool", loop, limits: ReadLimits):
        self.pool = pool
        self.loop = loop
        self.limits = limits
        self.transport = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self.headers_done = False  # for the answer in hand: its status line and headers are in
        self.body_fed = False  # body bytes came out of the last feed
        self.since_body = 0  # bytes fed after the headers without any body among them

    # ---- asyncio ---------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None or resp.complete or self.closed:
            self.abort()  # bytes nobody asked for: this connection is not reusable
            return
        self._feed(resp, data)

    def _feed(self, resp: Response, data: bytes) -> None:
        self.body_fed = False
        try:
            self.parser.feed_data(data)
        except _Abort:
            return
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Abort):
                return  # a callback has failed the answer and closed the connection
            self._not_http(resp, exc)
            return
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._not_http(resp, exc)
            return
        if resp.complete:
            return
        # What the parser keeps to itself until a header line ends (a line
        # spread over many reads) is counted here, so it is bounded too.
        if not self.headers_done:
            resp._head_bytes += len(data)
            if resp._head_bytes > self.limits.max_header_bytes:
                self._refuse(resp, self._too_many_header_bytes())
        elif self.body_fed:
            self.since_body = 0
        else:
            self.since_body += len(data)  # chunk framing and trailers
            if self.since_body > self.limits.max_header_bytes:
                self._refuse(resp, self._too_many_header_bytes())

    def _not_http(self, resp: Response, exc: Exception) -> None:
        if resp.status and not resp.complete:
            resp._fail(Incomplete(f"the answer is not valid HTTP: {exc}"))
        elif not resp.status:
            resp._fail(Disconnected(f"the answer is not valid HTTP: {exc}"))
        self.abort()

    def _too_many_header_bytes(self) -> Refused:
        return Refused(f"the answer's headers are over {self.limits.max_header_bytes} bytes")

    def _refuse(self, resp: Response, exc: Refused) -> None:
        resp._fail(exc)
        self.abort()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.pool.forget(self)
        resp = self.resp
        if resp is None or resp._error is not None or resp.complete:
            return
        if resp.status and resp._to_eof:
            resp.complete = True
            resp._wake()
        elif resp.status:
            resp._fail(Incomplete("the connection closed before the answer was complete"))
        else:
            resp._fail(Disconnected(f"the connection closed before any answer ({exc or 'EOF'})"))

    # ---- httptools ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        resp = self.resp
        if resp.complete:
            # A second answer to one request: the engine and the gateway no
            # longer agree where answers end. Keep the first, drop the connection.
            self.abort()
            raise _Abort()
        self.headers_done = False

    def on_status(self, status: bytes) -> None:
        resp = self.resp
        resp._head_bytes += len(status)
        if resp._head_bytes > self.limits.max_header_bytes:
            self._refuse(resp, self._too_many_header_bytes())
            raise _Abort()
        resp.reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        resp = self.resp
        resp._head_count += 1
        resp._head_bytes += len(name) + len(value)
        if resp._head_count > self.limits.max_headers:
            self._refuse(resp, Refused(f"the answer has over {self.limits.max_headers} headers"))
            raise _Abort()
        if resp._head_bytes > self.limits.max_header_bytes:
            self._refuse(resp, self._too_many_header_bytes())
            raise _Abort()
        if not self.headers_done:
            resp._headers.append((name.lower(), value))  # trailers are counted, not kept

    def on_headers_complete(self) -> None:
        resp = self.resp
        status = self.parser.get_status_code()
        if status == 101:
            self._refuse(resp, Refused("the engine switched protocols (101)", "upstream_malformed"))
            raise _Abort()
        if status < 200:
            # 100 Continue and friends: the real status follows.
            resp._headers.clear()
            resp.reason = ""
            return
        self.headers_done = True
        self.since_body = 0
        resp.status = status
        resp._to_eof = (
            resp.header(b"content-length") is None
            and "chunked" not in (resp.header(b"transfer-encoding") or "").lower()
            and status not in (204, 304)
        )
        resp._wake()

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        self.body_fed = True
        resp._received += len(body)
        if resp._max_body is not None and resp._received > resp._max_body:
            self._refuse(resp, _too_large(resp._max_body))
            raise _Abort()
        resp._chunks.append(body)
        resp._buffered += len(body)
        if resp._buffered > _HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        resp._wake()

    def on_message_complete(self) -> None:
        resp = self.resp
        if resp.status:
            # Asked now: once the message is done the parser has forgotten it.
            resp._keep_alive = self.parser.should_keep_alive()
            resp.complete = True
            resp._wake()

    # ---- the pool's side -------------------------------------------------------

    def abort(self) -> None:
        """Close for good: what is left unread on this connection belongs to nobody."""
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.abort()

    def resume(self) -> None:
        if self.paused and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def done(self, reuse: bool) -> None:
        resp, self.resp = self.resp, None
        if resp is None:
            return
        if reuse and resp._keep_alive and not self.closed and not resp._to_eof:
            self.resume()
            self.pool.put(self)
        else:
            self.closed = True
            self.transport.close()


class _Pool:
    __slots__ = ("host", "port", "idle")

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = port
        self.idle: list[_Conn] = []

    def put(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def forget(self, conn: _Conn) -> None:
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def take(self) -> _Conn | None:
        idle = self.idle
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if time.monotonic() - conn.idle_since > _IDLE_S:
                conn.closed = True
                conn.transport.close()
                continue
            return conn
        return None

    def close(self) -> None:
        for conn in self.idle:
            conn.closed = True
            conn.transport.close()
        self.idle.clear()


def _framed(head: bytes, body: bytes) -> bytes:
    """``head`` (up to Content-Length's name) with the length and the body."""
    return b"%s%d\r\n\r\n%s" % (head, len(body), body)


def _begin(conn: _Conn, request: bytes) -> Response:
    """``request`` on ``conn``, its answer to come in the returned ``Response``."""
    resp = conn.resp = Response(conn)
    conn.transport.write(request)
    return resp


class Client:
    """Pooled connections per replica address; one request per connection at a time."""

    def __init__(self, connect_timeout_s: float, limits: ReadLimits | None = None):
        self.connect_timeout_s = connect_timeout_s
        self.limits = limits or ReadLimits()
        self._pools: dict[tuple[str, int], _Pool] = {}

    async def post(
        self, host: str, port: int, head: bytes, body: bytes, first_byte_s: float = 0.0
    ) -> Response:
        """Send ``head`` (request line and headers up to Content-Length's name) and ``body``;
        return once the status line and headers are in.

        ``first_byte_s`` (0: none): ``NoAnswer`` if they are not in by then, counted
        from now. A clock of the client's own rather than ``asyncio.timeout``
        around the call: the wait has a timer anyway, and the request path pays
        for one timer instead of two.
        """
        return await self._send(host, port, _framed(head, body), first_byte_s)

    async def get(self, host: str, port: int, path: str) -> Response:
        name = f"[{host}]" if ":" in host else host
        request = f"GET {path} HTTP/1.1\r\nHost: {name}:{port}\r\nAccept: */*\r\n\r\n"
        return await self._send(host, port, request.encode())

    async def _send(
        self, host: str, port: int, request: bytes, first_byte_s: float = 0.0
    ) -> Response:
        # time.monotonic, not the loop's clock: asking for the running loop costs a
        # getpid() system call (CPython checks for a fork), and this is per request.
        deadline = time.monotonic() + first_byte_s if first_byte_s else 0.0
        pool = self._pool(host, port)
        conn = pool.take()
        reused = conn is not None
        if conn is None:
            conn = await self._connect(pool, deadline)
        while True:
            resp = _begin(conn, request)
            try:
                while not resp.status:
                    if resp._error is not None:
                        raise resp._error
                    if deadline:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise NoAnswer(f"no answer within {first_byte_s:g} s")
                        await resp._wait(left, resp._no_answer)
                    else:
                        await resp._wait()
            except Disconnected:
                conn.done(reuse=False)
                if not reused:
                    raise
                # An idle kept-alive connection that the engine closed just as the
                # request went out: nothing was answered, so send it once more on
                # a new connection rather than fail a request the engine never saw.
                reused = False
                conn = await self._connect(pool, deadline)
                continue
            except BaseException:
                conn.done(reuse=False)
                raise
            return resp

    def _pool(self, host: str, port: int) -> _Pool:
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = _Pool(host, port)
        return pool

    async def _connect(self, pool: _Pool, deadline: float = 0.0) -> _Conn:
        """A new connection within the connect timeout (and before ``deadline``, if any:
        the time ``post`` was given for its answer)."""
        loop = asyncio.get_running_loop()
        timeout_s = self.connect_timeout_s
        clipped = False
        if deadline:
            left = deadline - time.monotonic()
            if left < timeout_s:
                if left <= 0:
                    raise NoAnswer("no time left to connect")
                timeout_s, clipped = left, True
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Conn(pool, loop, self.limits), pool.host, pool.port
                )
        except TimeoutError:
            if clipped:
                raise NoAnswer("the time for an answer ran out while connecting") from None
            raise ConnectFailed(f"no connection within {self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from None
        return conn

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
