"""The agent checks what it is told about weights, whatever the control plane says.

Findings: ``weights_sha256`` names with ``../..`` were saved, and the agent hashed and
reported a file outside the entry; downloads followed redirects to ftp://; the hub
token travelled on an https -> http redirect to the same host and port. Real HTTP(S)
servers in this process; the control plane's half through its API.
"""

from __future__ import annotations

import hashlib
import os
import socket
import socketserver
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentd.fetch import http, sources, store
from agentd.fetch.fetcher import Fetcher, FetchError, FetchSettings
from tests.factories import bearer, manage_key
from tests.processes.weights_server import WeightsServer

DATA = os.urandom(50_000)


class Progress:
    async def __call__(self, done, total):
        pass


def fetcher(tmp_path, **kw) -> Fetcher:
    kw.setdefault("stall_s", 10.0)
    # The test servers listen on loopback, which a node refuses unless it allows it.
    kw.setdefault("allow_networks", ("127.0.0.0/8",))
    return Fetcher(FetchSettings(roots=[tmp_path / "weights"], **kw))


# ---- names stay inside their entry -------------------------------------------------------


async def test_a_checksum_naming_a_file_outside_the_entry_reads_nothing_there(tmp_path):
    # given a fetched copy, and a file beside the weights dir whose checksum is known
    with WeightsServer() as srv:
        srv.files["tiny.gguf"] = DATA
        src = sources.parse(srv.url("tiny.gguf"))
        f = fetcher(tmp_path)
        await f.fetch(src, {}, "a", Progress())
    secret = tmp_path / "secret"
    secret.write_bytes(b"not weights\n")
    outside = "../../secret"
    assert (f.entry(src) / outside).resolve() == secret.resolve()

    # when a profile's checksums name it
    with pytest.raises(FetchError) as err:
        f.ready(src, {outside: hashlib.sha256(secret.read_bytes()).hexdigest()})

    # then the shard fails naming the file, and no hash of it is kept or told
    assert f"'{outside}' is not a file inside the fetched copy" in str(err.value)
    assert hashlib.sha256(secret.read_bytes()).hexdigest() not in str(err.value)
    assert outside not in store.read_meta(f.entry(src))["sha256"]


async def test_a_fetch_with_such_a_checksum_asks_nothing_of_the_server(tmp_path):
    with WeightsServer() as srv:
        srv.files["tiny.gguf"] = DATA
        src = sources.parse(srv.url("tiny.gguf"))

        with pytest.raises(FetchError, match="'/etc/passwd' is not a file inside"):
            await fetcher(tmp_path).fetch(src, {"/etc/passwd": "a" * 64}, "a", Progress())

        assert srv.requests == []


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "Q8_0/../../x.gguf", "/etc/passwd", "a//b", "./x", "a\\..\\b"]
)
def test_the_rule_both_ends_use(name):
    assert "not a file inside the fetched copy" in sources.name_problem(name)
    assert sources.check_sha256({name: "a" * 64})


@pytest.mark.parametrize("name", ["model.gguf", "Q8_0/tiny-00001-of-00002.gguf", "a..b.json"])
def test_plain_names_pass(name):
    assert sources.name_problem(name) is None


@pytest.mark.django_db
def test_the_control_plane_refuses_to_save_such_a_name(client):
    from fleet.models import EngineProfile
    from tests.factories import add_model

    model = add_model("tiny")
    _, secret = manage_key()

    resp = client.post(
        "/api/v1/engine-profiles/",
        {
            "model": model.pk,
            "name": "fetched",
            "engine": "llamacpp",
            "model_path": "hf://org/tiny",
            "weights_sha256": {"../../etc/passwd": "a" * 64},
        },
        content_type="application/json",
        **bearer(secret),
    )

    assert resp.status_code == 400, resp.content
    assert "'../../etc/passwd' is not a file inside the fetched copy" in str(resp.json())
    assert not EngineProfile.objects.filter(name="fetched").exists()


# ---- redirects -----------------------------------------------------------------------------


class TwoFaced(socketserver.ThreadingTCPServer):
    """One port speaking both TLS and plain HTTP (by the first byte), as a host that
    redirects https://host:port to http://host:port would be reached. Every plain
    request's head is kept in ``plain``; TLS requests are answered ``redirect``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, tls: tuple, redirect: str):
        self.plain: list[bytes] = []
        self.redirect = redirect
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(*tls)
        super().__init__(("127.0.0.1", 0), _TwoFacedHandler)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _TwoFacedHandler(socketserver.BaseRequestHandler):
    def handle(self):
        conn = self.request
        tls = conn.recv(1, socket.MSG_PEEK) == b"\x16"
        if tls:
            conn = self.server.ctx.wrap_socket(conn, server_side=True)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        if tls:
            where = self.server.redirect.format(port=self.server.port)
            answer = f"HTTP/1.1 302 Found\r\nLocation: {where}\r\nContent-Length: 0\r\n"
            conn.sendall(answer.encode() + b"Connection: close\r\n\r\n")
        else:
            self.server.plain.append(head)
            status = f"HTTP/1.1 200 OK\r\nContent-Length: {len(DATA)}\r\n"
            conn.sendall(status.encode() + b"Connection: close\r\n\r\n" + DATA)
        conn.close()


@pytest.fixture
def ca(tmp_path):
    from tests.processes.tls import CA

    return CA.create(tmp_path / "ca", name="weights CA")


def test_a_token_does_not_follow_an_https_to_http_redirect(tmp_path, ca):
    # given a host whose https answer redirects to its own port in plain http
    srv = TwoFaced(ca.issue("127.0.0.1", server=True), "http://127.0.0.1:{port}/tiny.gguf")
    try:
        # when the file is fetched with a hub token
        size, _ = http.download(
            f"https://127.0.0.1:{srv.port}/tiny.gguf",
            tmp_path / "tiny.gguf.partial",
            headers={"Authorization": "Bearer hf_secret_token"},
            op=http.opener(str(ca.pem)),
            stall_s=10,
        )
    finally:
        srv.shutdown()
        srv.server_close()

    # then the file came, and the token never crossed the wire in the clear
    assert size == len(DATA)
    [head] = srv.plain
    assert b"hf_secret_token" not in head


class Redirecting:
    """An HTTP server answering every HEAD and GET with a 302 to ``location``."""

    def __init__(self, location: str):
        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):  # noqa: N802 - http.server's name
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD  # noqa: N815

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


async def test_a_redirect_to_ftp_is_not_followed(tmp_path):
    # given an ftp "server" that notes whether anybody came, and a redirect to it
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    ftp = f"ftp://127.0.0.1:{listener.getsockname()[1]}/tiny.gguf"
    srv = Redirecting(ftp)
    try:
        src = sources.parse(f"{srv.url}/tiny.gguf")

        # when the agent fetches the file
        with pytest.raises(FetchError) as err:
            await fetcher(tmp_path, stall_s=2).fetch(src, {}, "a", Progress())
    finally:
        srv.close()

    # then it says why, and never went there
    assert "redirected (302) to ftp://" in str(err.value)
    assert "http(s) only" in str(err.value)
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
