"""A small keep-alive HTTP/1.1 client for the request path: POST to a replica, stream the answer.

aiohttp's client spent more CPU per proxied request than the rest of the
gateway together (docs/benchmarks.md, Gateway). This does only what the
gateway needs — one request at a time per pooled connection, bodies with a
Content-Length, chunked or read to the close, no redirects, cookies,
compression or proxies.

Here: which connection a request goes out on — pooled per replica address,
reused while kept alive and not idle past ``_IDLE_S``, made within the connect
timeout and the time the request was given for its answer — and a stale pooled
connection's request sent once more on a new one. The exchange itself (the
answer parsed within its bounds, and the errors the caller learns) is
``fleet.gateway.http1``'s.
"""

import asyncio
import time

from .http1 import ConnectFailed, Connection, Disconnected, NoAnswer, ReadLimits, Response

_IDLE_S = 30.0  # a pooled connection unused for longer is closed, not reused


class _Pool:
    __slots__ = ("host", "port", "idle")

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = port
        self.idle: list[Connection] = []

    def put(self, conn: Connection) -> None:
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def forget(self, conn: Connection) -> None:
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def take(self) -> Connection | None:
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
            resp = conn.begin(request)
            try:
                while not resp.status:
                    if resp.error is not None:
                        raise resp.error
                    if deadline:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise NoAnswer(f"no answer within {first_byte_s:g} s")
                        await resp.wait(left, resp.no_answer)
                    else:
                        await resp.wait()
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

    async def _connect(self, pool: _Pool, deadline: float = 0.0) -> Connection:
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
                    lambda: Connection(pool, loop, self.limits), pool.host, pool.port
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
