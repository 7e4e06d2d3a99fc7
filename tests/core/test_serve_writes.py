"""How llmgw_site.serve writes answers: the head goes out with the body's first bytes,
in one write, and never waits for a body that comes later."""

import asyncio

import uvicorn

from llmgw_site import serve
from tests.processes import free_port


async def _served(app, client, keep_alive_s: float = 5) -> None:
    """Run ``app`` on uvicorn with serve's protocol, call ``client(port)``, stop."""
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http=serve.HeadLimitsProtocol,
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_keep_alive=keep_alive_s,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(client(port), 20)  # a bound on a hang, not a timing check
    finally:
        server.should_exit = True
        await task


def test_a_head_is_sent_before_a_body_that_comes_later():
    # given an app that starts its answer, then waits until the client has the head
    head_seen = asyncio.Event()

    async def app(scope, receive, send):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await head_seen.wait()  # a stream whose first token is slow
        await send({"type": "http.response.body", "body": b"data: 1\n\n"})

    async def client(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        # when the client reads the head: it has it without the body
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        head_seen.set()
        # then the body follows
        assert b"data: 1" in await reader.readuntil(b"data: 1\n\n")
        writer.close()

    asyncio.run(_served(app, client))


async def _echo_path(scope, receive, send):
    body = scope["path"].encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _get(reader, writer, path: bytes) -> bytes:
    writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    return await reader.readexactly(len(path))


def test_answers_on_one_connection_arrive_whole_and_in_order():
    async def client(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for path in (b"/first", b"/second", b"/third"):
            assert await _get(reader, writer, path) == path
        writer.close()

    asyncio.run(_served(_echo_path, client))


def test_a_connection_in_use_stays_open_past_the_keep_alive_and_closes_once_idle():
    async def client(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # given a keep-alive of 0.5 s, a client that asks every 0.1 s for 1.5 s
        for i in range(15):
            assert await _get(reader, writer, f"/{i}".encode()) == f"/{i}".encode()
            await asyncio.sleep(0.1)
        # then, idle, the server closes the connection
        assert await reader.read() == b""
        writer.close()

    asyncio.run(_served(_echo_path, client, keep_alive_s=0.5))


class _Transport:
    def __init__(self):
        self.calls = []
        self.closed = False

    def write(self, data):
        self.calls.append(("write", data))

    def writelines(self, parts):
        self.calls.append(("writelines", b"".join(parts)))

    def is_closing(self):
        return self.closed

    def close(self):
        self.calls.append(("close", b""))
        self.closed = True


def test_head_and_body_in_one_pass_of_the_loop_go_out_in_one_write():
    async def go():
        t = _Transport()
        w = serve._HeadWithBody(t, asyncio.get_running_loop())
        w.write(b"HEAD")
        w.write(b"BODY")
        w.write(b"MORE")
        await asyncio.sleep(0)
        return t.calls

    assert asyncio.run(go()) == [("writelines", b"HEADBODY"), ("write", b"MORE")]


def test_a_head_alone_goes_out_at_the_end_of_the_pass_and_before_a_close():
    async def go():
        t = _Transport()
        w = serve._HeadWithBody(t, asyncio.get_running_loop())
        w.write(b"HEAD")
        await asyncio.sleep(0)
        w.write(b"BODY")
        other = _Transport()
        w2 = serve._HeadWithBody(other, asyncio.get_running_loop())
        w2.write(b"HEAD2")
        w2.close()
        await asyncio.sleep(0)
        return t.calls, other.calls

    alone, closed = asyncio.run(go())
    assert alone == [("write", b"HEAD"), ("write", b"BODY")]
    assert closed == [("write", b"HEAD2"), ("close", b"")]
