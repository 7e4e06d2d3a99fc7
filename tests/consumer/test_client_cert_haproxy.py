"""Node identity by client certificate, end to end: the real HAProxy, web process and agents.

HAProxy runs the configuration docs/security.md documents (its own paths and
ports swapped in) and verifies agents' certificates against a CA this test
makes. The web process trusts ``X-Forwarded-For`` from anyone
(``--forwarded-allow-ips '*'``), the loosest a deployment could be, and the
certificate header only from HAProxy's address (127.0.0.2: HAProxy's connections
leave from there, so the test's own, from 127.0.0.1, are "not the proxy").
"""

import asyncio
import json
import socket
import ssl

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from agentd.protocol import CloseCode
from fleet.models import JoinToken, Node
from tests.factories import join_token
from tests.processes import start_agent, start_web, wait_until, write_config
from tests.processes.tls import CA, HAPROXY_MISSING, haproxy_binary, start_haproxy

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

PROXY_SOURCE = "127.0.0.2"


class Site:
    """A site's PKI in front of the control plane: the CA, HAProxy and the web process behind it."""

    def __init__(self, tmp_path, web, haproxy, nodes_ca: CA, proxy_ca: CA):
        self.tmp_path, self.web, self.haproxy = tmp_path, web, haproxy
        self.nodes_ca, self.proxy_ca = nodes_ca, proxy_ca

    def agent_config(self, name: str, node_id: str, cert_cn: str | None = None, **fields):
        """An agent.yaml in its own directory, presenting a certificate for ``cert_cn``."""
        directory = self.tmp_path / name
        directory.mkdir()
        if cert_cn is not None:
            cert, key = self.nodes_ca.issue(cert_cn)
            fields.update(tls_cert_file=str(cert), tls_key_file=str(key))
        return write_config(
            directory,
            self.haproxy.ws_url,
            node_id=node_id,
            tls_ca_file=str(self.proxy_ca.pem),
            **fields,
        )

    def logs(self) -> str:
        return (
            f"\n--- web\n{self.web.output()[-3000:]}\n--- haproxy\n{self.haproxy.output()[-3000:]}"
        )


# What trusts X-Forwarded-For from any address.
TRUST_ANY_PROXY = ["--forwarded-allow-ips", "*"]


@pytest.fixture
def site(transactional_db, tmp_path):
    binary = haproxy_binary()
    if binary is None:
        pytest.fail(HAPROXY_MISSING)
    nodes_ca = CA.create(tmp_path / "nodes-ca", "site nodes CA")
    proxy_ca = CA.create(tmp_path / "proxy-ca", "site proxy CA")
    cert, key = proxy_ca.issue("localhost", server=True)
    server_pem = tmp_path / "proxy.pem"  # HAProxy's crt: the certificate, then its key
    server_pem.write_bytes(cert.read_bytes() + key.read_bytes())
    web = start_web(
        tmp_path,
        args=TRUST_ANY_PROXY,
        LLMGW_CLIENT_CERT_PROXIES=PROXY_SOURCE,
        LLMGW_HEARTBEAT_INTERVAL_S="0.5",
    )
    try:
        haproxy = start_haproxy(
            binary,
            tmp_path,
            server_pem=server_pem,
            client_ca=nodes_ca.pem,
            backend_port=web.port,
            source=PROXY_SOURCE,
        )
    except Exception:
        web.stop()
        raise
    yield Site(tmp_path, web, haproxy, nodes_ca, proxy_ca)
    haproxy.stop()
    web.stop()


def _registered(node_id) -> bool:
    """Registered, connected, and a heartbeat's load written."""
    return Node.objects.filter(pk=node_id, connected=True, load__isnull=False).exists()


def test_a_node_with_its_own_certificate_registers_and_nothing_gets_around_the_proxy(site):
    # (a) given a join token, and a certificate whose CN is the node id
    _, secret = join_token()
    config = site.agent_config("a", "gpu-cert-01", cert_cn="gpu-cert-01", join_token=secret)

    # when the agent starts, then it enrols through HAProxy and heartbeats
    agent = start_agent(config)
    try:
        wait_until(
            lambda: _registered("gpu-cert-01"),
            what="gpu-cert-01 to register and heartbeat" + site.logs(),
            proc=agent,
        )
    finally:
        assert agent.terminate() == 0, agent.output()
    credential = (config.parent / "state" / "credential").read_text().strip()
    assert credential

    # (d) when that node's credential and CN are sent straight to the web process, with a
    # forged X-Forwarded-For naming the proxy: refused, and the header is not trusted
    code, reason = asyncio.run(
        _direct(
            site.web.port,
            {
                "Authorization": f"Bearer {credential}",
                "X-LLMGW-Client-CN": "gpu-cert-01",
                "X-Forwarded-For": PROXY_SOURCE,
            },
        )
    )
    assert code == CloseCode.FORBIDDEN, site.logs()
    assert reason.startswith("this control plane identifies nodes by client certificate")
    assert "not from 127.0.0.1" in reason  # the connection's address, not the forged one
    assert "X-LLMGW-Client-CN header from 127.0.0.1 ignored" in site.web.output()


async def _direct(port: int, headers: dict) -> tuple[int, str]:
    """Straight to the web process; the close code and the reason given, before any register."""
    url = f"ws://127.0.0.1:{port}/ws/agent/"
    closing = {}
    async with websockets.connect(url, additional_headers=headers, open_timeout=10) as ws:
        with pytest.raises(ConnectionClosed) as info:
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert msg["type"] == "closing", msg  # never an ack
                closing = msg
    assert info.value.rcvd is not None and closing.get("code") == info.value.rcvd.code
    return info.value.rcvd.code, closing["reason"]


def test_a_certificate_for_another_node_is_refused_as_a_credential_for_another_is(site):
    # (b) given a join token, and the certificate of gpu-cert-02 on gpu-cert-01
    token, secret = join_token()
    config = site.agent_config("b", "gpu-cert-01", cert_cn="gpu-cert-02", join_token=secret)

    # when the agent starts, then it is refused (4003) and stops: retrying cannot help
    agent = start_agent(config)
    try:
        code = agent.proc.wait(60)
    finally:
        agent.kill()
    refusal = "this credential is for node 'gpu-cert-02', not 'gpu-cert-01'"
    assert code == 3, agent.output() + site.logs()
    assert "closed the socket with 4003" in agent.output()
    assert refusal in agent.output()  # the reason reaches the node's own log
    assert f"agent socket closed code=4003 reason={refusal}" in site.web.output()
    # and nothing was written, the token's use included
    assert not Node.objects.exists()
    assert JoinToken.objects.get(pk=token.pk).uses == 0


def test_without_a_certificate_the_proxy_refuses_the_tls_handshake(site):
    # (c) given an agent with no client certificate, trusting the proxy's CA
    _, secret = join_token()
    config = site.agent_config("c", "gpu-cert-03", join_token=secret)

    # when it starts, then the proxy fails the TLS handshake, and the agent keeps trying
    # (TLS 1.3 sends the verdict after the client's side of the handshake, and
    # asyncio's TLS turns the alert into a plain end of stream: the agent cannot
    # say more than that no HTTP answer came)
    agent = start_agent(config)
    try:
        wait_until(
            lambda: (
                "SSL handshake failure" in site.haproxy.output()
                and agent.output().count("cannot reach the control plane") >= 2
            ),
            what="the proxy to refuse the agent's handshake, twice" + site.logs(),
            proc=agent,
        )
    finally:
        assert agent.terminate() == 0, agent.output()
    assert "did not receive a valid HTTP response" in agent.output()

    # and a bare TLS client sees the same, as does one whose certificate another CA signed
    assert "certificate required" in _handshake(site, None)
    rogue = CA.create(site.tmp_path / "rogue-ca", "someone else's CA")
    assert "unknown ca" in _handshake(site, rogue.issue("gpu-cert-03"))

    # nothing reached the control plane
    assert not Node.objects.exists()
    assert "/ws/agent/" not in site.web.output()


def _handshake(site, cert) -> str:
    """Complete a TLS handshake with HAProxy and read; the SSL error it ends in, lower case."""
    ctx = ssl.create_default_context(cafile=str(site.proxy_ca.pem))
    if cert is not None:
        ctx.load_cert_chain(*map(str, cert))
    with socket.create_connection(("127.0.0.1", site.haproxy.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLError) as err:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                # TLS 1.3: the server's verdict on the client's certificate comes
                # after the client's side of the handshake, with the first read.
                tls.sendall(b"GET /ws/agent/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
                tls.recv(1)
    return str(err.value).lower()
