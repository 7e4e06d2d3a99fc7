"""URL sources never reach internal addresses unless the node allows it.

The address checked is the one connected to (so a name that resolves differently
between a check and the connection cannot pass), every redirect's hop included;
through a proxy, the target's name as resolved here. Real HTTP servers on
loopback addresses in this process.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentd.config import ConfigError, parse_config
from agentd.fetch import sources
from agentd.fetch.fetcher import Fetcher, FetchError, FetchSettings
from agentd.fetch.http import AddressGuard, address_kind
from tests.processes.weights_server import WeightsServer

DATA = os.urandom(40_000)
KEYS = "fetch.allow_private_addresses, or its network in fetch.allow_networks"


class Progress:
    async def __call__(self, done, total):
        pass


def fetcher(tmp_path, **kw) -> Fetcher:
    return Fetcher(FetchSettings(roots=[tmp_path / "weights"], stall_s=5.0, **kw))


@pytest.fixture
def server():
    with WeightsServer() as srv:
        srv.files["tiny.gguf"] = DATA
        yield srv


# ---- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address, kind",
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # an IPv4-mapped address is its IPv4 one
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),  # ULA
        ("169.254.169.254", "link-local"),  # the clouds' metadata service
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-public"),  # shared address space (carrier NAT)
        ("93.184.215.14", None),
        ("2606:4700::6810:84e5", None),
    ],
)
def test_which_addresses_are_internal(address, kind):
    problem = AddressGuard().problem(address)

    assert problem == (None if kind is None else f"{problem.split(',')[0]}, a {kind} address")
    if ":" not in address:
        assert address_kind(ipaddress.ip_address(address)) == kind


def test_a_node_may_allow_every_address_or_some_networks():
    some = AddressGuard.of(allow_networks=["10.0.0.0/8", "fd00::/8", "127.0.0.2"])

    assert some.problem("10.20.0.7") is None
    assert some.problem("fd12::1") is None
    assert some.problem("127.0.0.2") is None
    assert some.problem("::ffff:10.0.0.1") is None
    assert some.problem("127.0.0.1") == "127.0.0.1, a loopback address"
    assert some.problem("192.168.0.1") == "192.168.0.1, a private address"
    assert AddressGuard.of(allow_private=True).problem("169.254.169.254") is None


def test_agent_yaml_names_the_allowance_and_refuses_a_network_it_cannot_read(tmp_path):
    base = {"control_plane_url": "ws://cp:8000/ws/agent/", "state_dir": str(tmp_path)}

    cfg = parse_config({**base, "fetch": {"allow_networks": ["10.0.0.0/8"]}})
    assert (cfg.fetch.allow_private_addresses, cfg.fetch.allow_networks) == (False, ["10.0.0.0/8"])
    assert parse_config(base).fetch.allow_networks == []
    with pytest.raises(ConfigError, match="fetch.allow_networks: 'intranet' is not a network"):
        parse_config({**base, "fetch": {"allow_networks": ["intranet"]}})


# ---- fetching ------------------------------------------------------------------------------


async def test_weights_on_loopback_are_refused_with_the_reason_and_nothing_is_written(
    tmp_path, server
):
    src = sources.parse(server.url("tiny.gguf"))

    # when: a node that allows nothing internal fetches from 127.0.0.1
    with pytest.raises(FetchError) as err:
        await fetcher(tmp_path).fetch(src, {}, "a", Progress())

    # then: it says where and why, the server heard nothing, and nothing was written
    assert str(err.value) == (
        f"{server.url('tiny.gguf')}: 127.0.0.1 is 127.0.0.1, a loopback address; this node "
        f"fetches from internal addresses only where its agent.yaml allows them ({KEYS}). "
        "Nothing was fetched"
    )
    assert server.requests == []
    assert not (tmp_path / "weights").exists()

    # when: the node allows loopback
    path = await fetcher(tmp_path, allow_networks=("127.0.0.0/8",)).fetch(src, {}, "a", Progress())

    # then: the same source is fetched
    assert path.read_bytes() == DATA


async def test_the_address_checked_is_the_one_a_name_resolved_to(tmp_path, server, monkeypatch):
    # given a public-looking name that resolves, when connected, to loopback
    real = socket.getaddrinfo

    def resolve(host, port, *args, **kwargs):
        if host == "weights.example":
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    src = sources.parse(f"http://weights.example:{server.port}/tiny.gguf")

    with pytest.raises(FetchError) as err:
        await fetcher(tmp_path).fetch(src, {}, "a", Progress())

    assert "weights.example is 127.0.0.1, a loopback address" in str(err.value)
    assert server.requests == []


class Redirect:
    """An HTTP server on ``host`` answering every request with a 302 to ``location``."""

    def __init__(self, host: str, location: str):
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):  # noqa: N802 - http.server's name
                outer.hits += 1
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD  # noqa: N815

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


async def test_every_redirect_hop_is_checked(tmp_path, server):
    # given a host the node allows (127.0.0.2) redirecting to one it does not (127.0.0.1)
    hop = Redirect("127.0.0.2", server.url("tiny.gguf"))
    try:
        src = sources.parse(f"{hop.url}/tiny.gguf")
        with pytest.raises(FetchError) as err:
            await fetcher(tmp_path, allow_networks=("127.0.0.2/32",)).fetch(
                src, {}, "a", Progress()
            )
    finally:
        hop.close()

    # then: the first hop answered, and the second was refused before a byte went to it
    assert hop.hits == 1
    assert str(err.value).startswith(f"{server.url('tiny.gguf')}: 127.0.0.1 is 127.0.0.1, a loop")
    assert server.requests == []
    assert not (tmp_path / "weights").exists()


async def test_through_a_proxy_the_target_is_checked_as_resolved_here(
    tmp_path, server, monkeypatch
):
    # given a proxy on loopback (the node's own choice; the weights server answers an
    # absolute-URI request as a proxy would), and names resolving public and private
    real = socket.getaddrinfo
    names = {"public.example": "93.184.215.14", "intranet.example": "10.0.0.5"}

    def resolve(host, port, *args, **kwargs):
        if host in names:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (names[host], port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", server.base)

    # when: a public name is fetched through it
    got = await fetcher(tmp_path).fetch(
        sources.parse("http://public.example/tiny.gguf"), {}, "a", Progress()
    )

    # then: it came through the proxy
    assert got.read_bytes() == DATA
    before = list(server.requests)

    # when: a name that resolves to a private address is asked for through the proxy
    with pytest.raises(FetchError) as err:
        await fetcher(tmp_path).fetch(
            sources.parse("http://intranet.example/tiny.gguf"), {}, "b", Progress()
        )

    # then: it is refused before the proxy hears of it
    assert "intranet.example resolves to 10.0.0.5, a private address" in str(err.value)
    assert server.requests == before


async def test_a_hub_endpoint_the_node_names_is_its_own_choice(tmp_path, server):
    from tests.processes.weights_server import HubRepo

    server.repos["org/tiny"] = HubRepo("org/tiny", {"tiny.gguf": DATA})
    f = fetcher(tmp_path, hf_endpoint=server.base)

    path = await f.fetch(sources.parse("hf://org/tiny/tiny.gguf"), {}, "a", Progress())

    assert path.read_bytes() == DATA
