"""One HTTP/1.1 exchange with an engine on one connection: the answer parsed as it
arrives (httptools, the parser uvicorn uses), within its bounds.

A ``Connection`` is the asyncio protocol; ``begin`` writes a request on it and
hands back the ``Response`` the answer arrives in, read whole (``read``) or as it
comes (``iter_chunks``), never further ahead of a slow reader than ``_HIGH_WATER``
bytes. Which connection a request goes out on, and when one is made or reused,
is ``fleet.gateway.upstream``'s.

What the caller learns, and when:
- ``ConnectFailed``: no connection could be made (refused, unreachable, timed out).
- ``Disconnected``: the connection closed before the status line; nothing was
  answered, so another replica may take the request.
- ``Incomplete``: the connection closed, or sent something that is not HTTP,
  after the answer began.
- ``Refused``: the engine's answer broke a bound (``ReadLimits``: headers too
  many or too large, a body too large, too long a silence) or switched
  protocols. The connection is closed, never reused.
- ``NoAnswer``: no status line within the time the request was given.

Everything read from an engine is bounded before it is kept (docs/gateway.md,
"Bounds on what engines send"). A complete answer ends the exchange: bytes
after it mean the engine and the gateway disagree on where answers end, so the
connection is closed rather than handed back, and those bytes never reach
anybody.
"""

import asyncio
from dataclasses import dataclass

import httptools

# Read no further ahead of a slow client than this: the engine waits instead.
_HIGH_WATER = 256 * 1024


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
        "error",
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
        self.error: UpstreamError | None = None  # the first thing that went wrong
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

    async def wait(self, idle_s: float = 0.0, late=None) -> None:
        """Until the connection feeds this answer something; ``late(idle_s)`` (by default,
        ``Refused`` for the silence) if nothing comes within ``idle_s`` (0: no bound)."""
        loop = self._conn.loop
        self._waiter = loop.create_future()
        timer = loop.call_later(idle_s, late or self._stalled, idle_s) if idle_s else None
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def no_answer(self, wait_s: float) -> None:
        """``wait``'s ``late`` while the status line is awaited: ``NoAnswer``."""
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
            elif self.error is not None:
                raise self.error
            else:
                await self.wait(self._conn.limits.idle_s)

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
            if self.error is not None:
                raise self.error
            if self._buffered > _HIGH_WATER // 2:
                self._conn.resume()  # a whole body is wanted, up to the limit
            await self.wait(idle_s)
        if self.error is not None:
            raise self.error
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
        if self.error is None and not self.complete:
            self.error = exc
            self._wake()


class Connection(asyncio.Protocol):
    """One connection to an engine, one exchange at a time. ``pool`` takes it back
    (``put``) when an answer leaves it reusable, and forgets it once it closes."""

    def __init__(self, pool, loop, limits: ReadLimits):
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
        if resp is None or resp.error is not None or resp.complete:
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

    # ---- the client's side -----------------------------------------------------

    def begin(self, request: bytes) -> Response:
        """``request`` written, its answer to come in the returned ``Response``."""
        resp = self.resp = Response(self)
        self.transport.write(request)
        return resp

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
