"""Doorbells rung by what the agent sockets' database threads commit go out on the web
process's own event loop, not on a new loop and new Redis connections each."""

import pytest
from django.db import transaction

from fleet.models import Node
from fleet.services import desired, doorbells
from fleet.sockets import db as socket_db
from tests.consumer.helpers import db, enrol

pytestmark = pytest.mark.django_db(transaction=True)


def _no_new_loop(*args, **kwargs):
    raise AssertionError("a ring from a socket's database thread made an event loop of its own")


async def test_a_change_committed_on_a_sockets_database_thread_reaches_its_agent(monkeypatch):
    # given: an agent connected to this process, and async_to_sync out of reach
    agent = await enrol("gpu-01")
    monkeypatch.setattr(doorbells, "async_to_sync", _no_new_loop)

    # when: a change to its desired set is committed on one of the threads the
    # sockets' database work runs on (socket_db), as a registration's or a
    # shard status's write is
    def change():
        with transaction.atomic():
            desired.bump_desired(["gpu-01"])

    await socket_db.call(change)

    # then: the socket hears of it and sends the new set, rung on this loop
    sent = await agent.recv_type("desired")
    assert sent["version"] == (await db(Node.objects.get)(pk="gpu-01")).desired_version
    await agent.close()


async def test_a_ring_from_a_thread_with_no_web_loop_running_still_goes(monkeypatch):
    # As from a Celery worker or a management command: no loop of the web process
    # to send it on (the last one registered has stopped), so async_to_sync sends it.
    agent = await enrol("gpu-01")
    rung = []
    real = doorbells.async_to_sync
    monkeypatch.setattr(doorbells, "_home", None)
    monkeypatch.setattr(doorbells, "async_to_sync", lambda fn: rung.append(fn) or real(fn))

    await socket_db.call(doorbells.ring_node, "gpu-01")

    assert rung == [doorbells.aring_node]
    await agent.recv_type("desired")
    await agent.close()
