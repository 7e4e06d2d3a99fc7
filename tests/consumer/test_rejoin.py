"""A fleet coming back to a web process that just started: the grace period moves with the
registrations until every node is back (fleet.services.reconciler.expiry.Rejoin), here
through the agents' real sockets."""

import pytest

from fleet.models import FleetStatus
from fleet.services.reconciler import expiry
from fleet.sockets import registrations
from tests.consumer.helpers import connect_as, db, enrol

pytestmark = pytest.mark.django_db(transaction=True)


async def test_the_wave_ends_when_every_node_has_registered_again(monkeypatch):
    # given: two enrolled nodes, their agents away while the control plane restarts
    first, second = await enrol("gpu-01"), await enrol("gpu-02")
    await first.close()
    await second.close()
    await db(FleetStatus.objects.get_or_create)(pk=1)
    rejoin = expiry.Rejoin()
    monkeypatch.setattr(registrations, "rejoin", rejoin)  # the new web process's

    # when: the first agent comes back, the grace period starts and the wave goes on
    again = await connect_as(first.credential, "gpu-01")
    grace = (await db(FleetStatus.objects.get)(pk=1)).grace_from
    assert grace is not None and not rejoin.over

    # then: with the second back, every node is: the wave is over, and from now on a
    # registration (a node reconnecting) moves the grace period no more
    await connect_as(second.credential, "gpu-02")
    assert rejoin.over
    back = (await db(FleetStatus.objects.get)(pk=1)).grace_from
    await again.close()
    await connect_as(first.credential, "gpu-01")
    assert (await db(FleetStatus.objects.get)(pk=1)).grace_from == back
