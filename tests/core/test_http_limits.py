"""The request head on a real web process (uvicorn through llmgw_site.serve): bounded in
time, lines and size, strict about framing."""

import socket
import time

import pytest

from tests.processes import start_web

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_web(
        tmp_path_factory.mktemp("web"),
        LLMGW_HTTP_HEAD_TIMEOUT_S=1,
        LLMGW_HTTP_MAX_HEADERS=20,
    )
    yield server
    server.stop()


def _connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def test_a_head_that_trickles_in_is_cut_off_with_408(server):
    # given a client that sends one header line every 0.25 s, never finishing its head
    sock = _connect(server)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    closed = False
    for i in range(40):  # 10 s of trickling: ten times the head deadline
        try:
            sock.sendall(f"X-Slow-{i}: y\r\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        time.sleep(0.25)
        sock.settimeout(0)
        try:
            answer = sock.recv(65536)
        except BlockingIOError:
            answer = None
        finally:
            sock.settimeout(10)
        if answer is not None:
            closed = True
            break
    # then the server answered 408 and hung up long before the client gave up
    assert closed
    assert answer is None or _status(answer) == 408
    sock.close()


def test_a_head_that_arrives_in_time_is_served(server):
    sock = _connect(server)
    sock.sendall(b"GET /no-such-page HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert _status(_read_all(sock)) == 404  # parsed, and Django answered
    sock.close()


def test_too_many_header_lines_are_refused(server):
    sock = _connect(server)
    lines = "".join(f"X-H-{i}: y\r\n" for i in range(30))
    sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n{lines}\r\n".encode())
    assert _status(_read_all(sock)) == 400
    sock.close()


def test_a_head_too_large_is_refused(server):
    # one header line of 100 KiB: Twisted refuses a line over 16 KiB, llmgw's
    # uvicorn protocol a head over 64 KiB (httptools alone would take any size);
    # either way the connection ends before the head is read
    sock = _connect(server)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
    try:
        for _ in range(100):
            sock.sendall(b"y" * 1024)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused while it was still sending: the answer is already in
    raw = _read_all(sock)
    assert _status(raw) == 431
    sock.close()


@pytest.mark.parametrize(
    "framing",
    [
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: gzip\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    ],
)
def test_ambiguous_body_framing_is_refused(server, framing):
    # RFC 9112: a proxy that reads the last Transfer-Encoding would frame this
    # body differently from a server that reads the first: refuse both ways.
    sock = _connect(server)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + framing + b"\r\n0\r\n\r\n"
    )
    assert _status(_read_all(sock)) == 400
    sock.close()


def test_one_chunked_body_is_still_read(server):
    sock = _connect(server)
    body = b'{"model": "m"}'
    sock.sendall(
        b"POST /no-such-page HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
    )
    assert _status(_read_all(sock)) == 404  # framed fine, read, and answered
    sock.close()
