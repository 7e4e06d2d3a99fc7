"""Bounds on what the gateway reads, through a real web process: clients' bodies and engines'
answers."""

import json
import re
import socket
import socketserver
import threading
import time

import pytest

from tests.factories import inference_key, ready_model
from tests.gateway.helpers import Upstream
from tests.gateway.live import post
from tests.processes import start_web

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
def server(transactional_db, tmp_path):
    """The web process, with small bounds."""
    s = start_web(
        tmp_path,
        LLMGW_GATEWAY_MAX_BODY_BYTES="65536",
        LLMGW_GATEWAY_EMBEDDINGS_MAX_BODY_BYTES="8192",
        LLMGW_GATEWAY_UPSTREAM_MAX_HEADER_BYTES="4096",
        LLMGW_GATEWAY_UPSTREAM_MAX_BODY_BYTES="65536",
        LLMGW_GATEWAY_UPSTREAM_IDLE_TIMEOUT_S="1",
        LLMGW_GATEWAY_MAX_RETRIES="0",
        LLMGW_GATEWAY_REFRESH_S="60",
        LLMGW_GATEWAY_KEYS_REFRESH_S="60",
    )
    yield s
    s.stop()


class RawEngine:
    """An engine that answers every request with the same bytes, whatever they are."""

    def __init__(self, answer: bytes):
        self.connections = 0
        engine = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                engine.connections += 1
                buf = b""
                try:
                    while True:
                        while b"\r\n\r\n" not in buf:
                            data = self.request.recv(65536)
                            if not data:
                                return
                            buf += data
                        head, _, buf = buf.partition(b"\r\n\r\n")
                        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                        while len(buf) < length:
                            buf += self.request.recv(65536)
                        buf = buf[length:]
                        self.request.sendall(answer)
                except OSError:
                    pass

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def raw_exchange(server, head: bytes, body_pieces=(), wait_s: float = 10.0) -> bytes:
    """Send a request head, then body pieces while the server listens; return what it said."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=wait_s)
    try:
        sock.sendall(head)
        for piece in body_pieces:
            try:
                sock.sendall(piece)
            except OSError:
                break  # refused and closed: what matters is the answer
        got = b""
        deadline = time.monotonic() + wait_s
        while not _whole(got) and time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                break
            if not data:
                break
            got += data
        return got
    finally:
        sock.close()


def _whole(answer: bytes) -> bool:
    """Whether ``answer`` holds a head and the body its Content-Length announces."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return length is None or len(body) >= int(length[1])


def status_of(answer: bytes) -> int:
    assert answer, "no answer"
    return int(answer.split(b" ", 2)[1])


def openai_error(answer: bytes) -> dict:
    body = json.loads(answer.partition(b"\r\n\r\n")[2] or b"{}")
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_a_body_is_refused_before_it_is_read(server):
    _, secret = inference_key()
    # given a client that announces 512 MiB and sends none of it
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 536870912\r\n%s\r\n"
    )
    # then without a key it hears 401 at once, not after 512 MiB
    got = raw_exchange(server, head % b"")
    assert status_of(got) == 401
    assert openai_error(got)["code"] == "missing_api_key"
    got = raw_exchange(server, head % b"Authorization: Bearer lgk_00000000_madeup\r\n")
    assert status_of(got) == 401
    # and with a key, 413 at once
    got = raw_exchange(server, head % f"Authorization: Bearer {secret}\r\n".encode())
    assert status_of(got) == 413
    assert "the limit is 65536" in openai_error(got)["message"]
    # each route has its own limit
    embed = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n"
        b"Authorization: Bearer %s\r\n\r\n" % secret.encode()
    )
    got = raw_exchange(server, embed)
    assert status_of(got) == 413 and "the limit is 8192" in openai_error(got)["message"]
    # a body with no length is counted as it streams: anonymous, it is not read at all
    chunked = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n%s\r\n"
    )
    piece = b"%x\r\n%s\r\n" % (16384, b"a" * 16384)
    got = raw_exchange(server, chunked % b"", [piece] * 64)
    assert status_of(got) == 401
    got = raw_exchange(
        server, chunked % f"Authorization: Bearer {secret}\r\n".encode(), [piece] * 64
    )
    assert status_of(got) == 413 and "over the limit of 65536" in openai_error(got)["message"]
    # a path that takes no body does not read a large one either: the app answers
    # at once, without a key 401
    got = raw_exchange(
        server, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"
    )
    assert status_of(got) == 401


def test_a_valid_request_still_goes_through_and_bad_json_is_400(server):
    up = Upstream()
    try:
        ready_model("tiny", [up])
        _, secret = (
            inference_key()
        )  # made after the web process started: the gateway has not seen it
        got, _, body = post(server, CHAT, {"model": "tiny", "messages": MSGS}, secret)
        assert got == 200, body
        # every bad shape is a 400 in OpenAI's shape, never a 500 page
        seed = b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "seed": %s}'
        for raw, fragment in [
            (b"[" * 30000 + b"]" * 30000, "deeper than 64"),
            (b'{"model": "tiny", "messages": ' + b"[" * 200 + b"]" * 200 + b"}", "deeper than 64"),
            (seed % (b"9" * 5000), "more digits"),
            (seed % b"NaN", "NaN is not a JSON number"),
            (seed % b"-Infinity", "Infinity is not a JSON number"),
            (seed % b"1e999", "out of range"),
        ]:
            got, headers, body = post(server, CHAT, raw, secret)
            assert got == 400, (raw[:60], body[:200])
            assert headers["content-type"] == "application/json"
            assert fragment in json.loads(body)["error"]["message"]
        assert up.served == 1  # none of them reached the engine
    finally:
        up.stop()


def test_an_engines_answer_past_a_bound_is_a_clean_502(server):
    _, secret = inference_key()
    engines = {
        "headers": RawEngine(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"),
        "body": RawEngine(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (1 << 20)
            + b" " * (1 << 20)
        ),
        "switch": RawEngine(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        ),
        "silent": RawEngine(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{"),
    }
    try:
        for name, engine in engines.items():
            ready_model(name, [engine])
        expect = {
            "headers": "headers are over 4096",
            "body": "over 65536 bytes",
            "switch": "switched protocols",
            "silent": "sent nothing for 1 s",
        }
        for name, fragment in expect.items():
            got, headers, body = post(server, CHAT, {"model": name, "messages": MSGS}, secret)
            assert got == 502, (name, body[:200])
            error = json.loads(body)["error"]
            assert fragment in error["message"], error
        assert "Traceback" not in server.output()
    finally:
        for engine in engines.values():
            engine.stop()


def test_two_answers_to_one_request_are_not_one_answer(server):
    _, secret = inference_key()
    one = b'{"id": "one", "choices": []}'
    two = b'{"id": "two", "choices": []}'
    answer = b"".join(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(b), b)
        for b in (one, two)
    )
    engine = RawEngine(answer)
    try:
        ready_model("twice", [engine])
        for _ in range(3):
            got, _, body = post(server, CHAT, {"model": "twice", "messages": MSGS}, secret)
            assert (got, body) == (200, one)
        # the connection that carried a stray answer was never used again
        assert engine.connections == 3
    finally:
        engine.stop()
