"""``llmgw`` sends its manage key only to the control plane it was told of.

The finding: a redirect from the control plane (or from whatever answers at its
address) sent the next request, key and all, to the host the redirect named. Two
real HTTP servers here: the configured one, and another host that records what
it was sent.
"""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentd import ctl
from agentd.ctl import exits

SECRET = "llmgw_manage_not-for-other-hosts"


class Server:
    """A real HTTP server on 127.0.0.1 answering every GET with ``answer(path)``:
    (status, headers, body); each request's path and Authorization header are kept."""

    def __init__(self, answer):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                seen.append((self.path, self.headers.get("Authorization")))
                status, headers, body = answer(self.path)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made = []

    def make(answer):
        made.append(Server(answer))
        return made[-1]

    yield make
    for server in made:
        server.close()


def llmgw(url: str, *args: str, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setenv("LLMGW_API_KEY", SECRET)
    monkeypatch.delenv("LLMGW_URL", raising=False)
    out, err = io.StringIO(), io.StringIO()
    status = ctl.main(["--url", url, *args], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_a_redirect_to_another_host_gets_no_key_and_names_the_host(servers, monkeypatch):
    # given a host that would like the key, and a control plane redirecting there
    other = servers(lambda path: (200, {"Content-Type": "application/json"}, b"[]"))
    elsewhere = f"http://localhost:{other.port}/api/v1/nodes/table/"
    home = servers(lambda path: (307, {"Location": elsewhere}, b""))

    # when llmgw asks the control plane for its nodes
    status, _, err = llmgw(
        f"http://127.0.0.1:{home.port}", "--json", "nodes", monkeypatch=monkeypatch
    )

    # then the other host heard nothing, and the error says where it was sent
    assert other.seen == []
    assert status == exits.EXIT_UNREACHABLE
    assert f"redirected (307) to http://localhost:{other.port}" in err
    assert "sends its key only to 127.0.0.1" in err
    assert home.seen == [("/api/v1/nodes/table/", f"Bearer {SECRET}")]


def test_a_redirect_to_another_scheme_is_refused(servers, monkeypatch):
    home = servers(lambda path: (302, {"Location": "ftp://127.0.0.1/nodes"}, b""))

    status, _, err = llmgw(f"http://127.0.0.1:{home.port}", "nodes", monkeypatch=monkeypatch)

    assert status == exits.EXIT_UNREACHABLE
    assert "redirected (302) to ftp://127.0.0.1" in err


def test_a_redirect_within_the_control_plane_is_followed_with_the_key(servers, monkeypatch):
    def answer(path):
        if path == "/api/v1/nodes/table/":
            return 301, {"Location": "/moved/api/v1/nodes/table/"}, b""
        return 200, {"Content-Type": "application/json"}, json.dumps([]).encode()

    home = servers(answer)

    status, out, err = llmgw(
        f"http://127.0.0.1:{home.port}", "--json", "nodes", monkeypatch=monkeypatch
    )

    assert (status, err) == (0, "")
    assert json.loads(out) == []
    assert home.seen[-1] == ("/moved/api/v1/nodes/table/", f"Bearer {SECRET}")
