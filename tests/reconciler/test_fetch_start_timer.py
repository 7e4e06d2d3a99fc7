"""A weights fetch and the start timeout: an hour's download neither fails the start nor
eats the engine's own startup time; progress never counts as a transition."""

import pytest

from agentd import protocol
from fleet.models import ReplicaState, Shard
from fleet.services import inventory
from tests.factories import add_model, add_node
from tests.reconciler.helpers import Clock, replicas, report, running

pytestmark = pytest.mark.django_db


def progress(shard, clock, done, total=10**9):
    inventory.apply_fetch_progress(
        shard.node_id,
        protocol.FetchProgress(
            type="fetch_progress", shard_id=shard.pk, bytes_done=done, bytes_total=total
        ),
    )
    Shard.objects.filter(pk=shard.pk).update(fetch_updated_at=clock.now)  # the test's clock


def test_the_engine_gets_its_whole_timeout_after_a_long_fetch():
    add_node("gpu-01")
    model = add_model(startup_timeout_s=600)
    clock = Clock()
    clock.pass_()
    [shard] = running(model)
    report(shard, "starting")
    started = Shard.objects.get(pk=shard.pk).state_changed_at

    # an hour and ten minutes of download, progress every minute
    for minute in range(1, 71):
        clock.advance(60, alive=["gpu-01"], step=60)
        progress(shard, clock, minute * 10**9 // 70)
    assert Shard.objects.get(pk=shard.pk).state_changed_at == started  # not a transition

    # the engine loads for 5 minutes after the download: past the fetch stall (120 s),
    # within its own 600 s
    clock.advance(300, alive=["gpu-01"], step=60)
    assert Shard.objects.get(pk=shard.pk).state == "starting"
    assert replicas(model)[0].state == ReplicaState.STARTING

    # and past its own timeout it fails, saying so
    clock.advance(310, alive=["gpu-01"], step=10)
    failed = Shard.objects.get(pk=shard.pk)
    assert (failed.state, failed.error) == ("failed", "not ready within 600 s (was starting)")
