"""A whole fleet registering at once: what the control plane does when it cannot keep up."""

import pytest
from asgiref.sync import sync_to_async

from agentd.protocol import CloseCode
from fleet.metrics import REGISTRY
from fleet.models import Node
from fleet.sockets import admission
from tests.consumer.helpers import communicator, db, enrol, expect_close, recv_type, send
from tests.factories import register_msg

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_registration_its_agent_has_stopped_waiting_for_is_not_written(monkeypatch):
    # given: an enrolled node whose agent went away and comes back
    first = await enrol("gpu-01")
    await first.close()
    before = await db(Node.objects.get)(pk="gpu-01")

    # when: its registration waits for the database longer than the agent waits for
    # the ack (here: any wait at all)
    monkeypatch.setattr("fleet.sockets.consumer.REGISTER_DEADLINE_S", -1)
    comm = communicator(first.credential)
    connected, _ = await comm.connect()
    assert connected
    await send(comm, register_msg("gpu-01", hostname="changed.example"))

    # then: the agent is told to come back later, and nothing was written
    code, reason = await expect_close(comm)
    assert code == CloseCode.TRY_AGAIN == 4013
    assert "try again" in reason
    after = await db(Node.objects.get)(pk="gpu-01")
    assert after.hostname == before.hostname
    assert after.registered_at == before.registered_at


async def test_a_handshake_that_waited_too_long_is_told_to_come_back(monkeypatch):
    first = await enrol("gpu-01")
    await first.close()
    monkeypatch.setattr("fleet.sockets.consumer.HANDSHAKE_DEADLINE_S", -1)

    comm = communicator(first.credential)
    connected, _ = await comm.connect()

    # Not a refusal of the credential (a 403, which ends agentd): under a server that
    # cannot answer a handshake with a status of its own (as here and under Daphne)
    # the socket opens and is closed with 4013 and when to come back; uvicorn
    # answers 503 with Retry-After (tests/consumer/test_admission_live.py).
    assert connected
    code, reason = await expect_close(comm)
    assert code == CloseCode.TRY_AGAIN
    assert reason.startswith("too busy to check the credential in time; retry after ")


async def test_past_the_admission_limit_an_agent_is_told_to_come_back(settings):
    # given: a web process that takes one agent at a time through registration
    first, second = await enrol("gpu-01"), await enrol("gpu-02")
    await first.close()
    await second.close()
    settings.LLMGW = {**settings.LLMGW, "AGENT_HANDSHAKES_MAX": 1}
    knocking = communicator(first.credential)
    assert (await knocking.connect())[0]

    # when: another knocks while the first has not registered yet
    turned = communicator(second.credential)
    assert (await turned.connect())[0]

    # then: it is told to come back; once the first is through, it is taken
    code, reason = await expect_close(turned)
    assert code == CloseCode.TRY_AGAIN
    assert reason.startswith("too many agents registering at once; retry after ")
    await send(knocking, register_msg("gpu-01"))
    assert (await recv_type(knocking, "ack"))["of"] == "register"
    again = communicator(second.credential)
    assert (await again.connect())[0]
    await send(again, register_msg("gpu-02"))
    assert (await recv_type(again, "ack"))["of"] == "register"
    await knocking.disconnect()
    await again.disconnect()


async def turned_away(why: str) -> float:
    # Off the event loop: collecting the registry runs the collectors that read the
    # database, which Django refuses from async code.
    value = await sync_to_async(REGISTRY.get_sample_value)(
        "llmgw_agent_handshakes_turned_away_total", {"why": why}
    )
    return value or 0


async def test_agents_turned_away_are_each_counted_and_logged_once_in_a_while(
    settings, caplog, monkeypatch
):
    # given: a web process that takes one agent at a time, with one in registration
    creds = [await enrol(n) for n in ("gpu-01", "gpu-02", "gpu-03")]
    for c in creds:
        await c.close()
    settings.LLMGW = {**settings.LLMGW, "AGENT_HANDSHAKES_MAX": 1}
    monkeypatch.setattr("fleet.sockets.admission._turned_away_log", admission._TurnedAwayLog())
    knocking = communicator(creds[0].credential)
    assert (await knocking.connect())[0]
    before = await turned_away("busy")

    # when: two more knock meanwhile
    for c in creds[1:]:
        comm = communicator(c.credential)
        assert (await comm.connect())[0]
        assert (await expect_close(comm))[0] == CloseCode.TRY_AGAIN

    # then: both are counted for Prometheus, and the log has one line, not one each
    assert await turned_away("busy") == before + 2
    lines = [r.getMessage() for r in caplog.records if "told to come back" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("agents told to come back: 1 since the last line; this one in ")
    assert "too many agents registering at once" in lines[0]
    await knocking.disconnect()
