"""Which address a node may name as its own: the gateway connects there."""

import pytest

from agentd import protocol
from agentd.protocol import CloseCode, ProtocolError
from fleet.models import Node
from fleet.services.access import mgmt_addr_refusal
from tests.consumer.helpers import communicator, db, enrol, expect_close, send, snapshot
from tests.factories import join_token, register_msg

REMOTE, LOCAL = "10.0.0.99", "127.0.0.1"  # where the agent's socket comes from


@pytest.mark.parametrize(
    "addr, peer, networks, refused_for",
    [
        ("10.0.0.7", REMOTE, "", None),
        ("2001:db8::7", REMOTE, "", None),
        ("", REMOTE, "", None),  # no address: nothing connects to it
        ("127.0.0.1", REMOTE, "", "loopback"),
        ("::1", REMOTE, "", "loopback"),
        ("::ffff:127.0.0.1", REMOTE, "", "loopback"),  # judged as what it maps
        ("127.0.0.1", LOCAL, "", None),  # the agent is on this machine: make run, tests
        ("127.0.0.1", None, "", "loopback"),  # not known to be this machine
        ("169.254.169.254", REMOTE, "", "link-local"),  # a cloud metadata service
        ("fe80::1", REMOTE, "", "link-local"),
        ("240.0.0.1", REMOTE, "", "reserved"),
        ("0.0.0.0", REMOTE, "", "not an address"),
        ("::", LOCAL, "", "not an address"),
        ("224.0.0.1", REMOTE, "", "not an address"),
        ("10.1.2.3", REMOTE, "10.0.0.0/8, fd00::/8", None),
        ("192.168.1.5", REMOTE, "10.0.0.0/8, fd00::/8", "outside the agent networks"),
        ("127.0.0.1", LOCAL, "10.0.0.0/8", "outside the agent networks"),
        ("127.0.0.1", REMOTE, "127.0.0.0/8", None),  # listed: the operator's choice
        ("0.0.0.0", REMOTE, "0.0.0.0/0", "not an address"),
    ],
)
def test_which_addresses_a_node_may_name(settings, addr, peer, networks, refused_for):
    settings.LLMGW = {**settings.LLMGW, "AGENT_ADDR_NETWORKS": networks}
    refusal = mgmt_addr_refusal(addr, peer)
    if refused_for is None:
        assert refusal is None
    else:
        assert refused_for in refusal and addr in refusal


@pytest.mark.parametrize("addr", ["gpu-01.example", "localhost", "10.0.0.7:8000", "10.0.0"])
def test_a_host_name_is_not_an_address(addr):
    with pytest.raises(ProtocolError) as err:
        protocol.parse_agent_message(register_msg(mgmt_addr=addr))
    assert err.value.code == CloseCode.INVALID_MESSAGE and "mgmt_addr" in err.value.reason


@pytest.mark.django_db(transaction=True)
async def test_an_enrolment_naming_a_metadata_address_is_refused_and_writes_nothing():
    _, secret = await db(join_token)()
    before = await db(snapshot)()
    comm = communicator(secret)
    assert (await comm.connect())[0]

    await send(comm, register_msg("gpu-01", mgmt_addr="169.254.169.254"))
    code, reason = await expect_close(comm)

    assert code == CloseCode.FORBIDDEN and "169.254.169.254" in reason
    assert await db(snapshot)() == before  # the token's use included


@pytest.mark.django_db(transaction=True)
async def test_an_enrolled_node_cannot_move_itself_to_loopback():
    agent = await enrol("gpu-01")

    await agent.send(register_msg("gpu-01", mgmt_addr="127.0.0.1"))
    code, reason = await expect_close(agent.comm)

    assert code == CloseCode.FORBIDDEN and "loopback" in reason
    assert (await db(Node.objects.get)(pk="gpu-01")).mgmt_addr == "10.0.0.7"


@pytest.mark.django_db(transaction=True)
async def test_an_agent_on_this_machine_may_name_loopback():
    _, secret = await db(join_token)()
    comm = communicator(secret)
    comm.scope["client"] = ["127.0.0.1", 40000]  # as Daphne says for a local agent
    assert (await comm.connect())[0]

    await send(comm, register_msg("gpu-01", mgmt_addr="127.0.0.1"))
    ack = await comm.receive_json_from(timeout=3)

    assert ack["type"] == "ack" and ack["of"] == "register"
    assert (await db(Node.objects.get)(pk="gpu-01")).mgmt_addr == "127.0.0.1"
    await comm.disconnect()
