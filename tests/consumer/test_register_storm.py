"""A whole fleet registering at once: what the control plane does when it cannot keep up."""

import pytest

from agentd.protocol import CloseCode
from fleet.models import Node
from tests.consumer.helpers import communicator, db, enrol, expect_close, send
from tests.factories import register_msg

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_registration_its_agent_has_stopped_waiting_for_is_not_written(monkeypatch):
    # given: an enrolled node whose agent went away and comes back
    first = await enrol("gpu-01")
    await first.close()
    before = await db(Node.objects.get)(pk="gpu-01")

    # when: its registration waits for the database longer than the agent waits for
    # the ack (here: any wait at all)
    monkeypatch.setattr("fleet.consumers.REGISTER_DEADLINE_S", -1)
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


async def test_a_handshake_that_waited_too_long_is_closed_unanswered(monkeypatch):
    first = await enrol("gpu-01")
    await first.close()
    monkeypatch.setattr("fleet.consumers.HANDSHAKE_DEADLINE_S", -1)

    connected, _ = await communicator(first.credential).connect()

    assert not connected
