"""The gateway's own HTTP/1.1 client against raw servers that answer each way HTTP allows."""

import asyncio

import pytest

from fleet.gateway.http1 import ConnectFailed, Disconnected, Incomplete
from fleet.gateway.upstream import Client
from tests.processes import free_port

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "


async def serve(answers: list[bytes], close_after: bool = False):
    """A server that reads one request per answer and writes the answer; counts connections."""
    seen = {"connections": 0, "requests": []}

    async def handle(reader, writer):
        seen["connections"] += 1
        try:
            while answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                seen["requests"].append(await reader.readexactly(length))
                writer.write(answers.pop(0))
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


async def test_answers_with_a_length_share_one_kept_alive_connection():
    server, port, seen = await serve([ok(b'{"a": 1}'), ok(b'{"b": 2}')])
    client = Client(1.0)
    for sent, want in ((b"one", b'{"a": 1}'), (b"two", b'{"b": 2}')):
        resp = await client.post("127.0.0.1", port, HEAD, sent)
        assert (resp.status, resp.content_type) == (200, "application/json")
        assert await resp.read() == want
        resp.release()
    assert seen == {"connections": 1, "requests": [b"one", b"two"]}
    client.close()
    server.close()


async def test_a_chunked_stream_arrives_piece_by_piece_and_ends():
    chunks = [b"data: 1\n\n", b"data: [DONE]\n\n"]
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    answer += b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    server, port, _ = await serve([answer])
    client = Client(1.0)
    resp = await client.post("127.0.0.1", port, HEAD, b"{}")
    assert resp.content_type == "text/event-stream"
    assert b"".join([c async for c in resp.iter_chunks()]) == b"".join(chunks)
    assert resp.complete
    client.close()
    server.close()


async def test_a_body_without_length_ends_with_the_connection():
    server, port, _ = await serve([b"HTTP/1.1 200 OK\r\n\r\nall of it"], close_after=True)
    client = Client(1.0)
    resp = await client.post("127.0.0.1", port, HEAD, b"{}")
    assert await resp.read() == b"all of it"
    client.close()
    server.close()


@pytest.mark.parametrize(
    "answer, error",
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", Disconnected),  # not HTTP at all
        (b"", Disconnected),  # closed without a word
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", Incomplete),
    ],
)
async def test_a_broken_answer_is_an_error_the_gateway_can_tell_apart(answer, error):
    server, port, _ = await serve([answer], close_after=True)
    client = Client(1.0)
    with pytest.raises(error):
        resp = await client.post("127.0.0.1", port, HEAD, b"{}")
        await resp.read()
    client.close()
    server.close()


async def test_nobody_listening_is_a_connect_failure():
    with pytest.raises(ConnectFailed):
        await Client(1.0).post("127.0.0.1", free_port(), HEAD, b"{}")


async def test_a_kept_alive_connection_the_engine_closed_is_replaced_not_failed():
    # given an engine that answers once, then drops its idle connection exactly
    # when the next request arrives on it (its keep-alive timeout racing ours)
    state = {"connections": 0}

    async def handle(reader, writer):
        state["connections"] += 1
        first = state["connections"] == 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(ok(b'{"n": %d}' % state["connections"]))
        await writer.drain()
        if first:
            await reader.readuntil(b"\r\n\r\n")  # the second request: hang up on it
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Client(1.0)
    resp = await client.post("127.0.0.1", port, HEAD, b"{}")
    assert await resp.read() == b'{"n": 1}'
    resp.release()

    # when the client sends the next request on the pooled connection
    resp = await client.post("127.0.0.1", port, HEAD, b"{}")

    # then it is answered, on a new connection, instead of failing
    assert await resp.read() == b'{"n": 2}'
    assert state["connections"] == 2
    client.close()
    server.close()
