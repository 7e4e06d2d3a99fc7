"""The gateway's HTTP/1.1 client bounds what engines send and keeps one answer per request."""

import asyncio
import time
from types import SimpleNamespace

import pytest

from fleet.gateway import engines
from fleet.gateway.http1 import Incomplete, ReadLimits, Refused
from fleet.gateway.upstream import Client

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
SMALL = ReadLimits(max_header_bytes=4096, max_headers=20, max_body_bytes=64 << 10, idle_s=0.3)


async def raw_server(answer, *, per_request=None):
    """A server that reads each request's head and writes ``answer`` (bytes, or a coroutine
    function of the writer); counts connections and the bytes it managed to write."""
    seen = {"connections": 0, "requests": 0, "written": 0}

    async def handle(reader, writer):
        seen["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if b"Content-Length: " in head:
                    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                seen["requests"] += 1
                if callable(answer):
                    await answer(writer, seen)
                else:
                    writer.write(answer)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # a cancel at the loop's end, too: this server has nothing to clean up
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
        % (
            extra,
            len(body),
            body,
        )
    )


def dribble(data: bytes, piece: int = 4096):
    """An answer written a piece at a time, each reaching the client by itself."""

    async def write(writer, seen):
        for i in range(0, len(data), piece):
            writer.write(data[i : i + piece])
            await writer.drain()
            seen["written"] += piece
            await asyncio.sleep(0)

    return write


async def answer_of(answer, limits=SMALL, read=True):
    server, port, seen = await raw_server(answer)
    client = Client(1.0, limits)
    try:
        async with asyncio.timeout(10):
            resp = await client.post("127.0.0.1", port, HEAD, b"{}")
            return (await resp.read() if read else resp), seen
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize(
    "answer, why",
    [
        # one header line far over the limit, arriving over many reads
        (dribble(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (1 << 20)), "headers are over 4096"),
        # many small headers
        (b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 21 + b"\r\n", "over 20 headers"),
        # a body declared over the limit of a whole answer
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\nxx", "over 65536 bytes"),
        # chunked, with no length to go by
        (
            dribble(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"1000\r\n"
                + b"a" * 4096
                + b"\r\n" * 1
                + (b"1000\r\n" + b"a" * 4096 + b"\r\n") * 40
            ),
            "over 65536 bytes",
        ),
        # to the close, with no length either
        (dribble(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"a" * (1 << 20)), "over 65536"),
        # endless trailers after the last chunk
        (
            dribble(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n"
                + b"X-T: "
                + b"t" * (1 << 20)
            ),
            "headers are over 4096",
        ),
        # endless interim answers
        (dribble(b"HTTP/1.1 100 Continue\r\n\r\n" * 20000), "headers are over 4096"),
    ],
)
async def test_an_answer_past_a_bound_is_refused_without_reading_it_all(answer, why):
    with pytest.raises(Refused, match=why):
        await answer_of(answer)


async def test_the_bounds_hold_by_default():
    # given the defaults (64 KiB of headers, 64 MiB of body), an answer past them
    limits = ReadLimits()
    assert (limits.max_header_bytes, limits.max_headers, limits.max_body_bytes) == (
        64 << 10,
        100,
        64 << 20,
    )
    with pytest.raises(Refused):
        await answer_of(dribble(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (1 << 20)), limits)


async def test_an_engine_silent_mid_body_is_refused_after_the_idle_time():
    async def stall(writer, seen):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        await asyncio.sleep(5)

    t0 = time.monotonic()
    with pytest.raises(Refused, match="sent nothing for 0.3 s"):
        await answer_of(stall)
    assert time.monotonic() - t0 < 3

    resp, _ = await answer_of(stall, read=False)
    with pytest.raises(Refused, match="sent nothing"):
        async for _ in resp.iter_chunks():
            pass


async def test_a_second_answer_is_never_part_of_the_first_and_the_connection_is_dropped():
    # given an engine that answers each request twice, in one write
    server, port, seen = await raw_server(ok(b'{"a": 1}') + ok(b'{"b": 2}'))
    client = Client(1.0, SMALL)
    # when two requests go one after the other
    bodies = []
    for _ in range(2):
        resp = await client.post("127.0.0.1", port, HEAD, b"{}")
        bodies.append(await resp.read())
        resp.release()
    # then each gets the first answer only, on a connection of its own
    assert bodies == [b'{"a": 1}', b'{"a": 1}']
    assert seen["connections"] == 2
    client.close()
    server.close()


async def test_bytes_after_a_complete_answer_close_the_connection_even_when_they_come_later():
    async def late(writer, seen):
        writer.write(ok(b'{"a": 1}'))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
        await writer.drain()

    server, port, seen = await raw_server(late)
    client = Client(1.0, SMALL)
    resp = await client.post("127.0.0.1", port, HEAD, b"{}")
    assert await resp.read() == b'{"a": 1}'
    await asyncio.sleep(0.2)
    resp.release()
    resp = await client.post("127.0.0.1", port, HEAD, b"{}")
    assert await resp.read() == b'{"a": 1}'
    assert seen["connections"] == 2
    client.close()
    server.close()


async def test_a_switch_of_protocols_is_refused_without_an_asyncio_traceback():
    errors = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda loop, context: errors.append(context))
    try:
        with pytest.raises(Refused, match="switched protocols"):
            await answer_of(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\n\r\n\x81\x05hello"
            )
        await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(None)
    assert errors == []


async def test_an_answer_within_the_bounds_still_arrives_whole():
    body = b"{" + b" " * (60 << 10) + b"}"
    got, _ = await answer_of(dribble(ok(body, b"X-A: 1\r\n" * 10)))
    assert got == body


async def test_a_cut_answer_is_still_incomplete_not_refused():
    async def cut(writer, seen):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        raise ConnectionError("gone")

    with pytest.raises(Incomplete):
        await answer_of(cut)


def _scraped_upstream(port: int):
    """What ``engines.scrape`` reads and writes of an upstream."""
    return SimpleNamespace(
        url=f"http://127.0.0.1:{port}", address=("127.0.0.1", port), engine_waiting=-1.0
    )


@pytest.mark.parametrize(
    "answer, waiting",
    [
        (ok(b"vllm:num_requests_waiting 3\n"), 3.0),
        # an exposition past the scrape's limit counts as none, and is not read whole
        (dribble(ok(b"vllm:num_requests_waiting 3\n" + b"#" * (1 << 20))), None),
        (dribble(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (1 << 20)), None),
    ],
)
async def test_scraping_an_engine_is_bounded_too(answer, waiting):
    server, port, seen = await raw_server(answer)
    client = Client(1.0, ReadLimits(max_header_bytes=4096, max_body_bytes=64 << 10, idle_s=0.3))

    up = _scraped_upstream(port)
    await engines.scrape(client, [up], 5.0)
    assert up.engine_waiting == waiting
    assert seen["written"] < (1 << 20)  # refused long before the end
    client.close()
    server.close()


async def test_an_engine_without_metrics_is_not_asked_again_every_scrape():
    not_found = b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nNot Found"
    server, port, seen = await raw_server(not_found)
    client = Client(1.0, ReadLimits(max_header_bytes=4096, max_body_bytes=64 << 10, idle_s=0.3))

    up = _scraped_upstream(port)
    for _ in range(5):
        await engines.scrape(client, [up], 5.0)
    # asked once: its log does not gain a 404 line every few seconds
    assert seen["requests"] == 1 and up.engine_waiting is None
    client.close()
    server.close()
