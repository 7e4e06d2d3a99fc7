"""The web process's command (llmgw_site.serve): its options, and what it does to each
connection's scope before the app sees it. The server itself runs in the live tests
(tests/gateway/test_edge_haproxy_live.py, tests/consumer/, tests/e2e/)."""

import asyncio
import re

import pytest

from fleet.sockets.peer import connection_peer
from llmgw_site import serve
from tests.processes import ROOT


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workers", "0"], "--workers must be 1 or more, not 0"),
        (["--port", "70000"], "--port must be 1-65535, not 70000"),
        (["--graceful-timeout", "0"], "--graceful-timeout must be positive, not 0"),
        (["--workers", "two"], "invalid int value: 'two'"),
        (["--backlog", "0"], "--backlog must be 1 or more, not 0"),
    ],
)
def test_bad_options_are_refused_naming_the_problem(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        serve.parse_args(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_the_defaults_listen_on_loopback_with_no_proxy_trusted(monkeypatch):
    monkeypatch.delenv(serve.ENV_TRUSTED, raising=False)
    args = serve.parse_args([])
    assert (args.host, args.port, args.workers) == ("127.0.0.1", 8000, 1)
    assert args.forwarded_allow_ips == ""
    assert not args.access_log
    # a fleet coming back after a restart knocks at once: more than uvicorn's 2,048
    assert args.backlog == 8192


def _seen(trusted: str, scope: dict) -> dict:
    """The scope the app is called with, behind ``_with_peer`` trusting ``trusted``."""
    got = {}

    async def app(scope, receive, send):
        got.update(scope)

    asyncio.run(serve._with_peer(app, trusted)(scope, None, None))
    return got


def _ws(client: str, forwarded: str | None = None) -> dict:
    headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded else []
    return {"type": "websocket", "client": (client, 5555), "headers": headers, "scheme": "ws"}


def test_a_forged_forwarded_for_never_becomes_the_connection_s_own_address():
    # given a web process that believes X-Forwarded-For from any address (the loosest)
    # when a client connects straight to it, naming the proxy in the header
    scope = _seen("*", _ws("10.0.0.99", forwarded="10.0.0.5"))
    # then the header sets the client, as proxy headers do, but the connection's
    # own address, which the client-certificate check reads, is the client's
    assert scope["client"][0] == "10.0.0.5"
    assert connection_peer(scope) == "10.0.0.99"


def test_forwarded_for_is_believed_only_from_the_trusted_proxy():
    through_proxy = _seen("10.0.0.5", _ws("10.0.0.5", forwarded="192.0.2.7"))
    assert through_proxy["client"][0] == "192.0.2.7"
    assert connection_peer(through_proxy) == "10.0.0.5"
    direct = _seen("10.0.0.5", _ws("10.0.0.99", forwarded="192.0.2.7"))
    assert direct["client"][0] == "10.0.0.99"


def test_without_trusted_proxies_the_header_is_ignored():
    scope = _seen("", _ws("10.0.0.99", forwarded="10.0.0.5"))
    assert scope["client"][0] == "10.0.0.99"
    assert connection_peer(scope) == "10.0.0.99"


def test_uvicorns_line_for_every_socket_is_left_out_and_the_rest_kept(caplog):
    # The agent consumer logs each agent socket with its node; uvicorn's own three
    # lines a socket are noise that cost the event loop a write each.
    import logging

    log = logging.getLogger("uvicorn.error")
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        log.info('%s - "WebSocket %s" [accepted]', "127.0.0.1:5000", "/ws/agent/")
        log.info("connection open")
        log.info("connection closed")
        log.info("Uvicorn running on %s", "http://127.0.0.1:8000")
        log.warning("connection closed")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "Uvicorn running on http://127.0.0.1:8000"),
        ("WARNING", "connection closed"),
    ]


class _Counted(asyncio.Protocol):
    made = 0

    def connection_made(self, transport):
        type(self).made += 1


def _made_in_turns(new_loop, turns: int, queued: int) -> int:
    """Connections a server on ``new_loop()`` has taken after ``turns`` turns of its
    loop, with ``queued`` already waiting in its listen queue."""
    import socket

    loop = new_loop()
    _Counted.made = 0
    try:
        server = loop.run_until_complete(loop.create_server(_Counted, "127.0.0.1", 0, backlog=1024))
        port = server.sockets[0].getsockname()[1]
        # the kernel completes each connection while the loop is not running
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(queued)]
        for _ in range(turns):
            loop.run_until_complete(asyncio.sleep(0))  # one turn, and whatever it schedules
        server.close()
        loop.run_until_complete(server.wait_closed())
        for c in clients:
            c.close()
        return _Counted.made
    finally:
        loop.close()


def test_the_web_process_takes_its_whole_listen_queue_in_a_few_turns_of_its_loop():
    import uvloop

    # uvloop (libuv) alone takes one connection a turn (a few turns a call here): a
    # fleet queued after a restart waits as many turns as it has agents ahead of it
    assert _made_in_turns(uvloop.new_event_loop, turns=20, queued=300) < 150
    # the web process's loop takes the queue at once
    assert _made_in_turns(serve.new_event_loop, turns=20, queued=300) == 300


def test_a_closed_server_takes_no_more_connections():
    import socket

    loop = serve.new_event_loop()
    _Counted.made = 0
    try:
        server = loop.run_until_complete(loop.create_server(_Counted, "127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        server.close()
        loop.run_until_complete(server.wait_closed())
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        loop.run_until_complete(asyncio.sleep(0))
        assert _Counted.made == 0
    finally:
        loop.close()


class _Stoppable(asyncio.Protocol):
    made: list = []

    def connection_made(self, transport):
        self.transport, self.shut = transport, False
        type(self).made.append(self)

    def shutdown(self):
        self.shut = True
        self.transport.close()


def test_connections_taken_as_the_server_closes_are_shut_down_too():
    import socket

    loop = serve.new_event_loop()
    _Stoppable.made = []
    try:
        server = loop.run_until_complete(loop.create_server(_Stoppable, "127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        # one turn: the queue is taken, the connections not made yet
        loop.call_soon(loop.stop)
        loop.run_forever()
        # when the server stops as uvicorn stops it: closed, then each connection
        # it knows of is shut down
        server.close()
        for protocol in list(_Stoppable.made):
            protocol.shutdown()
        for _ in range(10):
            loop.run_until_complete(asyncio.sleep(0))
        # then none is left open to serve a stopping process
        assert all(p.shut for p in _Stoppable.made)
        for c in clients:
            c.settimeout(5)
            assert c.recv(1) == b""  # closed by the server
            c.close()
        loop.run_until_complete(server.wait_closed())
    finally:
        loop.close()


def test_the_uvicorn_pinned_is_the_one_serve_py_was_checked_against():
    # llmgw_site.serve relies on uvicorn's options and on the protocol's shutdown()
    # being there for connections its acceptor takes; an upgrade is read here first.
    pinned = re.search(r"^uvicorn==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)
    assert pinned, "requirements.txt pins no uvicorn"
    assert pinned[1] == serve.UVICORN_CHECKED, (
        f"requirements.txt pins uvicorn {pinned[1]}; llmgw_site/serve.py was checked against "
        f"{serve.UVICORN_CHECKED}: read its docstring against the new release, then update "
        "UVICORN_CHECKED"
    )
    import uvicorn

    assert uvicorn.__version__ == pinned[1], "the virtualenv's uvicorn is not the one pinned"
