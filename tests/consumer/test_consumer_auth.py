"""Who may open the agent socket, and as which node."""

import logging
from datetime import timedelta

import pytest
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from agentd.protocol import CloseCode
from fleet.models import GPU, JoinToken, Node, NodeCredential
from fleet.services import access
from llmgw_site.asgi import application
from tests.consumer.helpers import (
    communicator,
    connect_as,
    db,
    enrol,
    expect_close,
    register,
    send,
    snapshot,
)
from tests.factories import join_token, register_msg

pytestmark = pytest.mark.django_db(transaction=True)


def closes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "agent socket closed" in r.getMessage()]


# ---- before accept -------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        None,
        b"",
        b"Bearer ",
        b"Bearer lgn_deadbeef_notarealcredential",
        b"Bearer lgj_deadbeef_notarealjointoken",
        b"Basic dXNlcjpwYXNz",
        b"lgn_deadbeef_nobearerword",
    ],
)
async def test_connection_without_a_valid_secret_is_refused(header, caplog):
    headers = [(b"authorization", header)] if header is not None else []
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    connected, _ = await comm.connect()
    assert not connected
    assert any("agent refused" in r.getMessage() for r in caplog.records)
    assert await db(Node.objects.count)() == 0


async def test_a_real_credential_in_the_wrong_case_of_bearer_still_works():
    agent = await enrol("gpu-01")
    await agent.close()
    headers = [(b"authorization", f"bearer  {agent.credential} ".encode())]
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    connected, _ = await comm.connect()
    assert connected
    await comm.disconnect()


# ---- enrolment -----------------------------------------------------------------


async def test_join_token_enrols_a_node_once_and_its_credential_works_after():
    # given a one-use join token
    token, secret = await db(join_token)("rack-1", 1)
    comm = communicator(secret)
    assert (await comm.connect())[0]

    # when an agent registers with it
    ack, desired = await register(comm, "gpu-01")
    await comm.disconnect()

    # then the ack carries the node's own credential, stored only hashed
    credential = ack["credential"]
    assert credential.startswith("lgn_")
    assert ack["heartbeat_interval_s"] == 10
    assert desired["type"] == "desired" and desired["shards"] == []
    cred = await db(NodeCredential.objects.get)(node_id="gpu-01")
    assert cred.secret_hash != credential and credential not in cred.secret_hash
    assert cred.join_token_id == token.pk
    node = await db(Node.objects.get)(pk="gpu-01")
    assert node.hostname == "gpu-01.example" and node.memory_total_mb == 2063500
    assert await db(GPU.objects.filter(node=node).count)() == 8
    assert (await db(JoinToken.objects.get)(pk=token.pk)).uses == 1

    # and the credential works on its own, without handing out another
    agent = await connect_as(credential, "gpu-01")
    assert agent.register_ack["credential"] is None
    await agent.close()

    # while the used-up join token no longer opens a socket
    connected, _ = await communicator(secret).connect()
    assert not connected


async def test_a_token_with_two_uses_enrols_two_nodes_and_no_third():
    token, secret = await db(join_token)("rack-2", 2)
    for node_id in ("gpu-01", "gpu-02"):
        comm = communicator(secret)
        assert (await comm.connect())[0]
        ack, _ = await register(comm, node_id)
        assert ack["credential"]
        await comm.disconnect()
    assert (await db(JoinToken.objects.get)(pk=token.pk)).uses == 2
    assert not (await communicator(secret).connect())[0]
    assert await db(Node.objects.count)() == 2


def _expired():
    token, secret = join_token("old")
    JoinToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    return secret


def _revoked():
    token, secret = join_token("revoked")
    access.revoke_join_token(token)
    return secret


def _used_up():
    token, secret = join_token("used", 3)
    JoinToken.objects.filter(pk=token.pk).update(uses=3)
    return secret


@pytest.mark.parametrize("make_secret", [_expired, _revoked, _used_up])
async def test_an_unusable_join_token_is_refused(make_secret):
    secret = await db(make_secret)()
    connected, _ = await communicator(secret).connect()
    assert not connected
    assert await db(Node.objects.count)() == 0


async def test_the_last_use_of_a_token_goes_to_one_of_two_racing_agents():
    # Both sockets open while the token still has its one use.
    token, secret = await db(join_token)("race", 1)
    first, second = communicator(secret), communicator(secret)
    assert (await first.connect())[0] and (await second.connect())[0]
    await register(first, "gpu-01")
    await send(second, register_msg("gpu-02"))
    code, reason = await expect_close(second)
    assert code == CloseCode.FORBIDDEN
    assert "used up" in reason
    assert not await db(Node.objects.filter(pk="gpu-02").exists)()
    assert (await db(JoinToken.objects.get)(pk=token.pk)).uses == 1
    await first.disconnect()


async def test_a_join_token_cannot_take_over_an_enrolled_node(caplog):
    # given an enrolled node
    agent = await enrol("gpu-01")
    await agent.close()
    token, secret = await db(join_token)("attacker", 1)
    comm = communicator(secret)
    assert (await comm.connect())[0]
    before = await db(snapshot)()

    # when a join token holder registers as that node
    await send(comm, register_msg("gpu-01", hostname="evil", gpus=[]))
    code, reason = await expect_close(comm)

    # then it is refused, the token keeps its use, and nothing changed
    assert code == CloseCode.FORBIDDEN
    assert "already enrolled" in reason
    assert await db(snapshot)() == before
    assert (await db(JoinToken.objects.get)(pk=token.pk)).uses == 0
    assert len(closes(caplog)) == 1
    # and the node's own credential still works
    again = await connect_as(agent.credential, "gpu-01")
    await again.close()


async def test_register_is_required_within_the_deadline(monkeypatch):
    monkeypatch.setattr("fleet.sockets.consumer.REGISTER_TIMEOUT_S", 0.2)
    _, secret = await db(join_token)()
    comm = communicator(secret)
    assert (await comm.connect())[0]
    code, reason = await expect_close(comm)
    assert code == CloseCode.NOT_REGISTERED
    assert "no register within" in reason


# ---- impersonation -------------------------------------------------------------


async def test_a_credential_for_one_node_cannot_register_as_another(caplog):
    # given node A enrolled, and its agent connecting again with A's credential
    agent = await enrol("gpu-a")
    await agent.close()
    comm = communicator(agent.credential)
    assert (await comm.connect())[0]
    before = await db(snapshot)()
    caplog.clear()
    caplog.set_level(logging.INFO)

    # when it registers as B
    await send(comm, register_msg("gpu-b"))
    code, reason = await expect_close(comm)

    # then it is refused with 4003, said once in the log, and nothing is written
    assert code == CloseCode.FORBIDDEN
    assert "gpu-a" in reason and "gpu-b" in reason
    assert len(closes(caplog)) == 1
    assert "code=4003" in closes(caplog)[0]
    assert not await db(Node.objects.filter(pk="gpu-b").exists)()
    assert await db(snapshot)() == before


async def test_a_second_register_naming_another_node_closes_the_socket(caplog):
    agent = await enrol("gpu-a")
    node_before = await db(Node.objects.values().get)(pk="gpu-a")
    caplog.clear()

    await agent.send(register_msg("gpu-b", gpus=[]))
    code, reason = await expect_close(agent.comm)

    assert code == CloseCode.FORBIDDEN
    assert "cannot register as 'gpu-b'" in reason
    assert len(closes(caplog)) == 1
    assert not await db(Node.objects.filter(pk="gpu-b").exists)()
    # Node A's inventory is untouched; only its socket is gone.
    node_after = await db(Node.objects.values().get)(pk="gpu-a")
    assert node_after["connected"] is False
    changed = {k for k in node_before if node_before[k] != node_after[k]}
    assert changed == {"connected", "channel_name"}
    assert await db(GPU.objects.filter(node_id="gpu-a").count)() == 8


async def test_a_second_register_for_the_same_node_updates_the_inventory(caplog):
    caplog.set_level(logging.INFO)
    agent = await enrol("gpu-a")
    # Operator intent, which no agent message may change.
    await db(Node.objects.filter(pk="gpu-a").update)(
        cordoned=True, draining=True, operator_labels={"zone": "b", "team": "infra"}
    )

    # A GPU fell off the bus and memory was added: the agent registers again.
    await agent.send(
        register_msg(
            "gpu-a",
            gpus=register_msg()["gpus"][:7],
            memory_total_mb=4127000,
            labels={"zone": "c", "rack": "r7"},
        )
    )
    ack = await agent.recv_type("ack")
    await agent.recv_type("desired")

    assert ack["of"] == "register" and ack["credential"] is None
    node = await db(Node.objects.get)(pk="gpu-a")
    assert node.memory_total_mb == 4127000 and node.connected
    assert await db(GPU.objects.filter(node=node).count)() == 7
    assert any("node memory changed node=gpu-a" in r.getMessage() for r in caplog.records)
    said = [r.getMessage() for r in caplog.records if r.name == "fleet.services.inventory"]
    assert [m.split(" gpus=")[0] for m in said if m.startswith("agent ")] == [
        "agent registered node=gpu-a",
        "agent re-registered node=gpu-a",
    ]
    assert node.cordoned and node.draining
    assert node.agent_labels == {"zone": "c", "rack": "r7"}
    assert node.labels == {"zone": "b", "rack": "r7", "team": "infra"}
    # The socket is still the node's: heartbeats go on.
    await agent.heartbeat(seq=2)
    await agent.close()


async def test_a_node_credential_cannot_be_used_by_a_second_socket_for_another_node():
    # The credential names its node whatever socket it arrives on.
    agent = await enrol("gpu-a")
    comm = communicator(agent.credential)
    assert (await comm.connect())[0]
    await send(comm, register_msg("gpu-b"))
    code, _ = await expect_close(comm)
    assert code == CloseCode.FORBIDDEN
    # The real agent's socket is unaffected.
    await agent.heartbeat()
    assert (await db(Node.objects.get)(pk="gpu-a")).connected
    await agent.close()
