"""Node identity by client certificate: the CN a trusted proxy passes must be the node.

The socket's peer is set as Daphne would set it; the real HAProxy in front of a
real Daphne and agent is in test_client_cert_haproxy.py.
"""

import logging

import pytest

from agentd.protocol import CloseCode
from fleet.models import JoinToken, Node
from fleet.services import access
from fleet.sockets.peer import PEER_KEY, connection_peer
from tests.consumer.helpers import communicator, db, enrol, expect_close, register, send, snapshot
from tests.factories import join_token, register_msg

pytestmark = pytest.mark.django_db(transaction=True)

PROXY, ELSEWHERE = "10.9.0.2", "10.0.0.99"
HEADER = access.CLIENT_CERT_HEADER.lower().encode()


@pytest.fixture
def cert_proxies(settings):
    settings.LLMGW = {**settings.LLMGW, "CLIENT_CERT_PROXIES": "10.9.0.0/29, fd00:9::1"}


def via(secret: str, peer: str, *cns: str):
    """A socket from ``peer`` (its TCP address, as Daphne keeps it) carrying these CN headers."""
    comm = communicator(secret)
    comm.scope["headers"] += [(HEADER, cn.encode()) for cn in cns]
    comm.scope["client"] = [peer, 40000]
    comm.scope["extensions"] = {PEER_KEY: peer}
    return comm


async def refused(comm) -> tuple[int, str]:
    assert (await comm.connect())[0]
    await send(comm, register_msg("gpu-01"))
    return await expect_close(comm)


async def test_off_by_default_the_header_means_nothing():
    _, secret = await db(join_token)()
    comm = via(secret, ELSEWHERE, "someone-else")
    assert (await comm.connect())[0]
    ack, _ = await register(comm, "gpu-01")
    assert ack["credential"]
    await comm.disconnect()


async def test_a_certificate_naming_the_node_enrols_it_and_connects_it_again(cert_proxies):
    _, secret = await db(join_token)()
    comm = via(secret, PROXY, "gpu-01")
    assert (await comm.connect())[0]
    ack, _ = await register(comm, "gpu-01")
    await comm.disconnect()

    again = via(ack["credential"], "fd00:9::1", "gpu-01")
    assert (await again.connect())[0]
    ack, _ = await register(again, "gpu-01")
    assert ack["credential"] is None
    await again.disconnect()


async def test_a_certificate_for_another_node_is_refused_as_a_credential_for_another_is(
    cert_proxies, caplog
):
    # given node gpu-01 enrolled through the proxy with its own certificate
    _, secret = await db(join_token)()
    comm = via(secret, PROXY, "gpu-01")
    assert (await comm.connect())[0]
    credential = (await register(comm, "gpu-01"))[0]["credential"]
    await comm.disconnect()

    # when gpu-01's credential comes with gpu-02's certificate
    comm = via(credential, PROXY, "gpu-02")
    assert (await comm.connect())[0]
    before = await db(snapshot)()  # after the connect, which notes the credential's use
    await send(comm, register_msg("gpu-01"))
    code, reason = await expect_close(comm)

    # then: the close of a credential for another node, and nothing written
    assert (code, reason) == (
        CloseCode.FORBIDDEN,
        "this credential is for node 'gpu-02', not 'gpu-01' (its client certificate's CN)",
    )
    assert await db(snapshot)() == before
    # and gpu-01's credential, registering as gpu-02 with gpu-02's certificate, is the old refusal
    comm = via(credential, PROXY, "gpu-02")
    assert (await comm.connect())[0]
    before = await db(snapshot)()
    await send(comm, register_msg("gpu-02"))
    assert await expect_close(comm) == (
        CloseCode.FORBIDDEN,
        access.mismatch_refusal("gpu-01", "gpu-02"),
    )
    assert await db(snapshot)() == before
    assert any("code=4003 reason=this credential is for node" in r.message for r in caplog.records)


async def test_a_join_token_is_not_used_up_by_a_certificate_for_another_node(cert_proxies):
    token, secret = await db(join_token)()
    code, reason = await refused(via(secret, PROXY, "gpu-02"))
    assert code == CloseCode.FORBIDDEN and "is for node 'gpu-02', not 'gpu-01'" in reason
    assert (await db(JoinToken.objects.get)(pk=token.pk)).uses == 0
    assert not await db(Node.objects.exists)()


@pytest.mark.parametrize("cns", [(), ("",), ("gpu-01", "gpu-01")], ids=["none", "empty", "two"])
async def test_the_proxy_must_pass_exactly_one_subject(cert_proxies, cns):
    _, secret = await db(join_token)()
    code, reason = await refused(via(secret, PROXY, *cns))
    assert code == CloseCode.FORBIDDEN
    assert f"the proxy at {PROXY} passed no client certificate subject" in reason
    assert not await db(Node.objects.exists)()


async def test_a_socket_around_the_proxy_is_refused_and_its_header_ignored(cert_proxies, caplog):
    # given: a valid credential, the right CN in the header, but not from a proxy;
    # Daphne's --proxy-headers would say "client" is the proxy: the connection's own
    # address is what counts
    _, secret = await db(join_token)()
    comm = via(secret, ELSEWHERE, "gpu-01")
    comm.scope["client"] = [PROXY, 0]

    code, reason = await refused(comm)

    assert code == CloseCode.FORBIDDEN
    assert "identifies nodes by client certificate" in reason and ELSEWHERE in reason
    assert not await db(Node.objects.exists)()
    assert any(
        f"X-LLMGW-Client-CN header from {ELSEWHERE} ignored" in r.getMessage()
        and r.levelno == logging.WARNING
        for r in caplog.records
    )


async def test_an_enrolled_node_without_a_certificate_is_refused_too(settings):
    agent = await enrol("gpu-01")  # enrolled before the feature was on
    await agent.close()
    settings.LLMGW = {**settings.LLMGW, "CLIENT_CERT_PROXIES": PROXY}
    code, reason = await refused(via(agent.credential, ELSEWHERE))
    assert code == CloseCode.FORBIDDEN and "client certificate" in reason


def test_the_peer_is_the_connections_own_address_when_daphne_kept_it():
    kept = {"client": ["10.1.1.1", 5], "extensions": {PEER_KEY: "10.2.2.2"}}
    assert connection_peer(kept) == "10.2.2.2"
    assert connection_peer({"client": ["10.1.1.1", 5]}) == "10.1.1.1"
    assert connection_peer({"client": None}) is None


def test_a_bad_proxy_network_is_refused_at_start_naming_the_variable():
    from fleet.conf import from_environ

    with pytest.raises(ValueError, match="LLMGW_CLIENT_CERT_PROXIES='10.0.0.0/33'"):
        from_environ({"LLMGW_CLIENT_CERT_PROXIES": "10.0.0.0/33"})
    assert from_environ({"LLMGW_CLIENT_CERT_PROXIES": "10.0.0.5"})["CLIENT_CERT_PROXIES"]


@pytest.mark.parametrize(
    "peer, values, node_id, refused_for",
    [
        ("10.9.0.2", ["gpu-01"], "gpu-01", None),
        ("10.9.0.7", [" gpu-01 "], "gpu-01", None),  # edge of 10.9.0.0/29; spaces trimmed
        ("::ffff:10.9.0.2", ["gpu-01"], "gpu-01", None),  # a dual-stack socket's IPv4 peer
        ("fd00:9::1", ["gpu-01"], "gpu-01", None),
        ("10.9.0.8", ["gpu-01"], None, "identifies nodes by client certificate"),
        ("fd00:9::2", ["gpu-01"], None, "identifies nodes by client certificate"),
        (None, ["gpu-01"], None, "not from an unknown address"),  # a unix socket
        ("10.9.0.2", [], None, "passed no client certificate subject"),
        ("10.9.0.2", ["gpu-01", "gpu-02"], None, "passed no client certificate subject"),
    ],
)
def test_which_sockets_a_certificate_counts_for(cert_proxies, peer, values, node_id, refused_for):
    check = access.client_cert_node(peer, values)
    assert check.node_id == node_id
    if refused_for is None:
        assert check.refusal is None
    else:
        assert refused_for in check.refusal


def test_off_the_header_is_not_even_looked_at():
    assert access.client_cert_node("10.0.0.99", ["gpu-01"]) == access.CertCheck()
