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
"""

import asyncio
import time

import httptools

# Read no further ahead of a slow client than this: the engine waits instead.
_HIGH_WATER = 256 * 1024
_IDLE_S = 30.0  # a pooled connection unused for longer is closed, not reused


class UpstreamError(Exception):
    pass


class ConnectFailed(UpstreamError):
    pass


class Disconnected(UpstreamError):
    pass


class Incomplete(UpstreamError):
    pass


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

    async def _wait(self) -> None:
        self._waiter = self._conn.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

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
                await self._wait()

    async def read(self) -> bytes:
        # A loop of its own, not over iter_chunks: an async generator costs more per answer.
        while not self.complete:
            if self._error is not None:
                raise self._error
            if self._buffered > _HIGH_WATER // 2:
                self._conn.resume()  # a whole body is wanted, however large
            await self._wait()
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
    def __init__(self, pool: "_Pool", loop):
        self.pool = pool
        self.loop = loop
        self.transport = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0

    # ---- asyncio ---------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:
            self.transport.close()  # bytes nobody asked for: this connection is not reusable
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            started = resp.status != 0
            kind = Incomplete if started else Disconnected
            resp._fail(kind(f"the answer is not valid HTTP: {exc}"))
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.pool.forget(self)
        resp = self.resp
        if resp is None:
            return
        if resp.status and resp._to_eof:
            resp.complete = True
            resp._wake()
        elif resp.status:
            resp._fail(Incomplete("the connection closed before the answer was complete"))
        else:
            resp._fail(Disconnected(f"the connection closed before any answer ({exc or 'EOF'})"))

    # ---- httptools ---------------------------------------------------------------

    def on_status(self, status: bytes) -> None:
        self.resp.reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.resp._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        resp = self.resp
        status = self.parser.get_status_code()
        if status < 200:
            # 100 Continue and friends: the real status follows.
            resp._headers.clear()
            resp.reason = ""
            return
        resp.status = status
        resp._to_eof = (
            resp.header(b"content-length") is None
            and "chunked" not in (resp.header(b"transfer-encoding") or "").lower()
            and status not in (204, 304)
        )
        resp._wake()

    def on_body(self, body: bytes) -> None:
        resp = self.resp
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


class Client:
    """Pooled connections per replica address; one request per connection at a time."""

    def __init__(self, connect_timeout_s: float):
        self.connect_timeout_s = connect_timeout_s
        self._pools: dict[tuple[str, int], _Pool] = {}

    async def post(self, host: str, port: int, head: bytes, body: bytes) -> Response:
        """Send ``head`` (request line and headers up to Content-Length's name) and ``body``;
        return once the status line and headers are in."""
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = _Pool(host, port)
        conn = pool.take()
        reused = conn is not None
        if conn is None:
            conn = await self._connect(pool)
        while True:
            resp = conn.resp = Response(conn)
            conn.transport.write(b"%s%d\r\n\r\n%s" % (head, len(body), body))
            try:
                while not resp.status:
                    if resp._error is not None:
                        raise resp._error
                    await resp._wait()
            except Disconnected:
                conn.done(reuse=False)
                if not reused:
                    raise
                # An idle kept-alive connection that the engine closed just as the
                # request went out: nothing was answered, so send it once more on
                # a new connection rather than fail a request the engine never saw.
                reused = False
                conn = await self._connect(pool)
                continue
            except BaseException:
                conn.done(reuse=False)
                raise
            return resp

    async def _connect(self, pool: _Pool) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Conn(pool, loop), pool.host, pool.port
                )
        except TimeoutError:
            raise ConnectFailed(f"no connection within {self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from None
        return conn

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
