"""A small Redis client for the gateway's hot path: one connection, commands pipelined.

The limits cost a Redis round trip per request; through redis-py's asyncio
client that was about 0.25 ms of CPU a request (bench/gateway.py), more than
the rest of the gateway. This speaks RESP itself on one connection per event
loop: a command is a write, its answer a future resolved in order by the
protocol's ``data_received``, the way the gateway's own HTTP client
(``upstream.py``) replaced aiohttp's. Only what the limits need: commands with
string and integer arguments, and replies of every RESP2 kind.

A reply that does not come within ``timeout`` closes the connection (its
answers could no longer be matched to their commands) and raises TimeoutError;
the caller decides what that request gets (``ratelimit``). A reply that came in
time but was read late, because the event loop was busy, is a reply, not a
timeout. The next command connects again.
"""

import asyncio
import ssl
from collections import deque
from urllib.parse import unquote, urlsplit


class ReplyError(Exception):
    """An error reply (``-ERR ...``, ``-NOSCRIPT ...``)."""


_INCOMPLETE = object()


def encode(args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(b), b))
    return b"".join(out)


def parse(buf, pos: int):
    """(value, next position) of the reply at ``pos``, or (_INCOMPLETE, pos)."""
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return _INCOMPLETE, pos
    kind = buf[pos]
    line = bytes(buf[pos + 1 : nl])
    after = nl + 2
    if kind == 0x3A:  # :
        return int(line), after
    if kind == 0x2B:  # +
        return line.decode(), after
    if kind == 0x2D:  # -
        return ReplyError(line.decode("utf-8", "replace")), after
    if kind == 0x24:  # $
        n = int(line)
        if n < 0:
            return None, after
        if len(buf) < after + n + 2:
            return _INCOMPLETE, pos
        return bytes(buf[after : after + n]), after + n + 2
    if kind == 0x2A:  # *
        n = int(line)
        if n < 0:
            return None, after
        items = []
        for _ in range(n):
            item, after = parse(buf, after)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, after
    raise ConnectionError(f"not a RESP reply: {bytes(buf[pos : pos + 20])!r}")


class _Protocol(asyncio.Protocol):
    def __init__(self):
        self.transport = None
        self.pending: deque[asyncio.Future] = deque()
        self.buf = bytearray()
        self.closed = False

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        buf = self.buf
        buf += data
        pos = 0
        try:
            while self.pending:
                value, end = parse(buf, pos)
                if value is _INCOMPLETE:
                    break
                pos = end
                fut = self.pending.popleft()
                if not fut.done():
                    fut.set_result(value)
        except (ValueError, ConnectionError) as exc:
            self.fail(ConnectionError(f"bad reply from Redis: {exc}"))
            return
        if pos:
            del buf[:pos]

    def connection_lost(self, exc):
        self.fail(ConnectionError(f"Redis closed the connection: {exc or 'EOF'}"))

    def fail(self, exc: Exception) -> None:
        self.closed = True
        while self.pending:
            fut = self.pending.popleft()
            if not fut.done():
                fut.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


class Client:
    """``redis://[:password@]host[:port][/db]``, ``rediss://…`` or ``unix:///path[?db=N]``."""

    def __init__(self, url: str, timeout: float = 0.25):
        self.url = url
        self.timeout = timeout
        self._conn: _Protocol | None = None
        self._connecting: asyncio.Future | None = None

    async def _connect(self) -> _Protocol:
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._open())
        return await asyncio.shield(self._connecting)

    async def _open(self) -> _Protocol:
        u = urlsplit(self.url)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout):
            if u.scheme == "unix":
                _, conn = await loop.create_unix_connection(_Protocol, u.path)
            elif u.scheme in ("redis", "rediss"):
                _, conn = await loop.create_connection(
                    _Protocol,
                    u.hostname or "localhost",
                    u.port or 6379,
                    ssl=ssl.create_default_context() if u.scheme == "rediss" else None,
                )
            else:
                raise ValueError(f"REDIS_URL scheme '{u.scheme}' is not redis, rediss or unix")
        self._conn = conn
        db = u.path.strip("/") if u.scheme != "unix" else ""
        for part in u.query.split("&"):
            if part.startswith("db="):
                db = part[3:]
        if u.password:
            auth = [unquote(u.username), unquote(u.password)] if u.username else [u.password]
            await self._call(conn, "AUTH", *auth)
        if db and db != "0":
            await self._call(conn, "SELECT", db)
        return conn

    async def _call(self, conn: _Protocol, *args, raw: bytes | None = None):
        if conn.closed:
            raise ConnectionError("the connection to Redis is closed")
        fut = asyncio.get_running_loop().create_future()
        conn.pending.append(fut)
        conn.transport.write(raw or encode(args))
        try:
            try:
                # Shielded: the deadline cancels the wait, not the reply's future.
                async with asyncio.timeout(self.timeout):
                    value = await asyncio.shield(fut)
            except TimeoutError:
                # The deadline is judged on what has arrived: after the loop was
                # busy elsewhere past it, the timer may fire before the socket is
                # read (uvloop runs timers first), so the loop gets a turn to read.
                for _ in range(2):
                    if fut.done():
                        break
                    await asyncio.sleep(0)
                if not fut.done():
                    fut.cancel()
                    conn.fail(ConnectionError("Redis did not answer in time"))
                    raise
                value = fut.result()  # in time, read late: Redis was not slow
        finally:
            if not fut.done():
                fut.cancel()  # the caller left: its reply, when it comes, is dropped
        if isinstance(value, ReplyError):
            raise value
        return value

    async def call(self, *args):
        """Send one command and return its reply; raises ReplyError, OSError, TimeoutError."""
        conn = self._conn
        if conn is None or conn.closed:
            conn = await self._connect()
        return await self._call(conn, *args)

    async def call_raw(self, command: bytes):
        """``call`` for a command already encoded (``encode``): cached by the caller."""
        conn = self._conn
        if conn is None or conn.closed:
            conn = await self._connect()
        return await self._call(conn, raw=command)

    def send_nowait(self, command: bytes) -> asyncio.Future | None:
        """Send an encoded command without waiting: the future gets its reply (an error reply
        as a ReplyError value). None when not connected; the caller then uses ``call_raw``."""
        conn = self._conn
        if conn is None or conn.closed:
            return None
        fut = asyncio.get_running_loop().create_future()
        conn.pending.append(fut)
        conn.transport.write(command)
        return fut

    def close(self) -> None:
        if self._conn is not None:
            self._conn.fail(ConnectionError("closed"))
            self._conn = None
