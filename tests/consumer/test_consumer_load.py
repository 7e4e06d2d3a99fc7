"""The agent socket when the control plane is busy: slow is not the agent's fault."""

import time

import pytest

from fleet.models import Node
from fleet.services import access
from tests.consumer.helpers import communicator, db, register
from tests.factories import join_token

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_register_that_arrived_in_time_is_not_refused_while_it_waits(monkeypatch):
    # A thousand agents reconnecting at once queue up behind each other's
    # registrations; one that sent its register in time must not be closed as
    # overdue, or it retries with a join token that has already enrolled it.
    monkeypatch.setattr("fleet.sockets.consumer.REGISTER_TIMEOUT_S", 0.2)
    enrol = access.enrol

    def slow_enrol(identity, node_id):
        time.sleep(0.5)  # the database thread is busy with other agents
        return enrol(identity, node_id)

    monkeypatch.setattr(access, "enrol", slow_enrol)
    _, secret = await db(join_token)()
    comm = communicator(secret)
    assert (await comm.connect())[0]

    ack, desired = await register(comm, "gpu-01")

    assert ack["credential"] and desired["type"] == "desired"
    assert (await db(Node.objects.get)(pk="gpu-01")).connected
    await comm.disconnect()
