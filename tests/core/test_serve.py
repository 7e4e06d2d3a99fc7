"""The web process's command (llmgw_site.serve): its options, and what it does to each
connection's scope before the app sees it. The server itself runs in the live tests
(tests/core/test_http_limits.py, tests/consumer/, tests/e2e/)."""

import asyncio

import pytest

from llmgw_site import serve
from llmgw_site.peer import connection_peer


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
