"""Connection bounds in the production arrangement: HAProxy, as docs/scaling.md configures
it, in front of the web process.

The web process does not bound a connection by itself (uvicorn re-arms no keep-alive
timer once a byte arrives, and reads a body for as long as it dribbles in); the
balancer in front does, and docs/security.md says the web process must not face the
internet without it. Each test runs docs/scaling.md's configuration as written, with
the test's own addresses and shorter timeouts and connection cap swapped in, and does
what a client holding connections open would do.
"""

import json
import re
import socket
import time

import pytest

from tests.factories import inference_key, ready_model
from tests.gateway.live import FAST_REFRESH, post, wait_until
from tests.processes import free_port, start_web
from tests.processes.tls import (
    HAPROXY_MISSING,
    documented_config,
    haproxy_binary,
    run_haproxy,
    swap,
)

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
DOC = "scaling.md"
# The documented timeouts, shortened so a test waits seconds, not minutes. A
# connection the balancer bounds is closed within the bound; one it does not is
# held until `timeout client` (60 s), which the tests wait far less than.
HTTP_REQUEST_S = 1
CLOSED_WITHIN_S = 8
MAX_CONN_PER_ADDRESS = 6


@pytest.fixture
def edge(request, transactional_db, tmp_path):
    """The web process behind docs/scaling.md's HAProxy; ``request.param`` may give the
    head's timeout (``http_request_s``) a test needs longer than the others do."""
    http_request_s = getattr(request, "param", {}).get("http_request_s", HTTP_REQUEST_S)
    binary = haproxy_binary()
    if binary is None:
        pytest.fail(HAPROXY_MISSING)
    web = start_web(tmp_path, **FAST_REFRESH)
    port = free_port()
    config = documented_config(DOC)
    for old, new in (
        ("bind :8000", f"bind 127.0.0.1:{port}"),
        ("server web1 10.0.0.10:8000", f"server web1 127.0.0.1:{web.port}"),
        ("    server web2 10.0.0.11:8000 check inter 2s fall 2 rise 2\n", ""),
        ("timeout http-request 10s", f"timeout http-request {http_request_s}s"),
        ("timeout http-keep-alive 10s", f"timeout http-keep-alive {HTTP_REQUEST_S}s"),
        ("sc0_conn_cur gt 256", f"sc0_conn_cur gt {MAX_CONN_PER_ADDRESS}"),
        # Its runtime socket, where a test reads what the stick table counts.
        (
            "    log stdout format raw local0\n",
            f"    log stdout format raw local0\n    stats socket {tmp_path}/haproxy.sock\n",
        ),
    ):
        config = swap(config, old, new, DOC)
    proxy = run_haproxy(binary, tmp_path, config, port, name="haproxy-edge")
    proxy.url = f"http://127.0.0.1:{port}"
    proxy.runtime = tmp_path / "haproxy.sock"
    yield web, proxy
    proxy.stop()
    web.stop()


def _connect(proxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    sock.settimeout(CLOSED_WITHIN_S)
    return sock


def _tracked(proxy) -> int:
    """The connections HAProxy's stick table counts now, from its runtime socket."""
    with socket.socket(socket.AF_UNIX) as runtime:
        runtime.connect(str(proxy.runtime))
        runtime.sendall(b"show table llmgw\n")
        said = b""
        while chunk := runtime.recv(65536):
            said += chunk
    return sum(int(n) for n in re.findall(rb"conn_cur=(\d+)", said))


def _closed(sock) -> bytes:
    """What the balancer says before it closes ``sock``; fails if it is still open."""
    said = b""
    began = time.monotonic()
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return said
            said += data
    except (ConnectionResetError, BrokenPipeError):
        return said
    except TimeoutError:
        waited = time.monotonic() - began
        raise AssertionError(f"the connection is still open after {waited:.0f} s") from None


def _head(secret: str, length: int, extra: str = "") -> bytes:
    return (
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode()


def _chat(model="tiny", **more) -> bytes:
    return json.dumps({"model": model, "messages": HI, **more}).encode()


def test_an_idle_connection_is_closed_even_after_a_stray_crlf(edge, upstreams):
    web, proxy = edge
    ready_model("tiny", [upstreams()])
    _, secret = inference_key()
    body = _chat()
    with _connect(proxy) as sock:
        sock.sendall(_head(secret, len(body)) + body)
        answer = b""
        while b'"choices"' not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        sock.sendall(b"\r\n")  # marks a connection busy for a server that counts bytes
        _closed(sock)


def test_a_refused_request_cannot_hold_its_connection_with_a_dribbled_body(edge):
    _, proxy = edge
    with _connect(proxy) as sock:
        sock.sendall(_head("sk-not-a-key", 1000) + b'{"model": ')
        time.sleep(0.3)
        sock.sendall(b"x")
        said = _closed(sock)
    assert said.startswith(b"HTTP/1.1 408"), said[:200]


def test_a_body_that_never_ends_is_cut_and_never_reaches_the_engine(edge, upstreams):
    _, proxy = edge
    up = upstreams()
    ready_model("tiny", [up])
    _, secret = inference_key()
    with _connect(proxy) as sock:
        sock.sendall(_head(secret, 1000) + b'{"model": "tiny", ')
        said = b""
        for _ in range(4 * CLOSED_WITHIN_S):
            time.sleep(0.25)
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
        said = _closed(sock)
    assert said.startswith(b"HTTP/1.1 408"), said[:200]
    assert up.served == 0 and up.requests == []


@pytest.mark.parametrize("kib", [70, 100])
def test_an_oversized_head_in_one_write_is_refused(edge, upstreams, kib):
    web, proxy = edge
    up = upstreams()
    ready_model("tiny", [up])
    _, secret = inference_key()
    body = _chat()
    with _connect(proxy) as sock:
        sock.sendall(_head(secret, len(body), f"X-Pad: {'a' * (kib << 10)}\r\n") + body)
        said = _closed(sock)
    assert said.startswith(b"HTTP/1.1 400"), said[:200]
    assert up.served == 0


# The held connections send nothing: under a 1 s head timeout a slow machine saw them
# closed, and their count gone, before the one more was judged.
@pytest.mark.parametrize("edge", [{"http_request_s": 60}], indirect=True)
def test_one_address_cannot_hold_every_connection(edge, upstreams):
    _, proxy = edge
    ready_model("tiny", [upstreams()])
    _, secret = inference_key()
    held = [_connect(proxy) for _ in range(MAX_CONN_PER_ADDRESS)]
    try:
        # Connected is not yet counted: HAProxy's threads take them from the backlog
        # in their own time, and under load the next one could be counted first.
        wait_until(lambda: _tracked(proxy) == MAX_CONN_PER_ADDRESS, 60, "all of them counted")
        with _connect(proxy) as one_more:
            try:
                one_more.sendall(_head(secret, len(_chat())) + _chat())
            except ConnectionResetError:
                pass  # refused before the request was written
            assert _closed(one_more) == b""
        held.pop().close()
        # The count follows the connections: once HAProxy has seen one close (in its
        # own time, as with the opening ones), one more is served.
        wait_until(lambda: _tracked(proxy) == MAX_CONN_PER_ADDRESS - 1, 60, "one released")
        assert post(proxy, CHAT, {"model": "tiny", "messages": HI}, secret)[0] == 200
    finally:
        for sock in held:
            sock.close()


def test_a_client_leaving_a_pipelined_stream_ends_the_engines_request(edge, upstreams):
    _, proxy = edge
    up = upstreams()
    ready_model("tiny", [up])
    _, secret = inference_key()
    assert post(proxy, CHAT, {"model": "tiny", "messages": HI}, secret)[0] == 200
    up.mode = "hang"
    stream, second = _chat(stream=True), _chat()
    with _connect(proxy) as sock:
        sock.sendall(_head(secret, len(stream)) + stream + _head(secret, len(second)) + second)
        wait_until(lambda: up.in_flight == 1, what="the engine has the stream")
    # Gone before the first byte: the engine's request ends now, not at the
    # gateway's first-byte timeout, and the request behind it is never sent.
    wait_until(lambda: up.cancelled == 1, what="the engine's request ended")
    up.release.set()
    assert up.in_flight == 0 and len(up.requests) == 2


def test_a_head_that_trickles_in_is_cut_off_with_408(edge):
    _, proxy = edge
    with _connect(proxy) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        for i in range(4 * CLOSED_WITHIN_S):  # a header line every 0.25 s, never ending
            try:
                sock.sendall(f"X-Slow-{i}: y\r\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.25)
        said = _closed(sock)
    assert said.startswith(b"HTTP/1.1 408"), said[:200]


def test_too_many_header_lines_are_refused(edge):
    _, proxy = edge
    lines = "".join(f"X-H-{i}: y\r\n" for i in range(120))
    with _connect(proxy) as sock:
        sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{lines}\r\n".encode())
        said = _closed(sock)
    assert said.startswith(b"HTTP/1.1 400"), said[:200]


@pytest.mark.parametrize(
    "framing",
    [
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: gzip\r\n",
    ],
)
def test_ambiguous_body_framing_is_refused(edge, upstreams, framing):
    # RFC 9112: a proxy reading the last Transfer-Encoding would frame this body
    # differently from a server reading the first; the balancer refuses it.
    _, proxy = edge
    up = upstreams()
    ready_model("tiny", [up])
    _, secret = inference_key()
    with _connect(proxy) as sock:
        sock.sendall(
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n".encode()
            + framing
            + b"\r\n0\r\n\r\n"
        )
        said = _closed(sock)
    assert said[:12] in (b"HTTP/1.1 400", b"HTTP/1.1 422"), said[:200]
    assert up.requests == []
