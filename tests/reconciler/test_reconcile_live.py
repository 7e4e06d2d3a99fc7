"""The reconciler over real processes: a real web process, a real agentd, the fake engine.

Passes are called here rather than by a worker, so the test decides when time
moves (the restart backoff is skipped by passing a later `now`, not by sleeping).
"""

import os
import signal
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from agentd import state
from fleet.models import Node, ReplicaState, Shard
from fleet.services.reconciler import passes as reconcile
from tests.factories import add_model, join_token
from tests.processes import port_block, start_agent, wait_for, write_config
from tests.reconciler.helpers import replicas

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def agent(live_web, tmp_path):
    _, secret = join_token(name="live reconciler")
    lo, hi = port_block()
    config = write_config(
        tmp_path,
        live_web.ws_url,
        node_id="cpu-live",
        join_token=secret,
        engine_port_range=[lo, hi],
        labels={"llmgw.io/ports": f"{lo}-{hi}"},
        engines={"binaries": {"fake": sys.executable}},
    )
    proc = start_agent(config)
    logs = [proc.log, live_web.log]
    wait_for(
        lambda: Node.objects.filter(
            pk="cpu-live", connected=True, engine_versions__has_key="fake"
        ).exists(),
        "the agent registering with the fake engine",
        logs=logs,
    )
    yield tmp_path / "state", logs
    for pid in {pid for pid, _env in state.find_marked(tmp_path / "state").values()}:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.proc.poll() is None:
        proc.terminate()


def shard_state(model):
    shard = Shard.objects.filter(replica__model=model, desired_state="running").first()
    return shard.state if shard else None


def test_placed_ready_then_killed_engine_restarted_after_backoff(agent):
    state_dir, logs = agent
    # a path under the agent's tmp tree, which its agent.yaml names (the fake engine reads none)
    weights = str(state_dir.parent / "fake-llm")
    model = add_model("fake-llm", engine="fake", gpus_per_node=0, args=["--load-time", "0.3"],
                      model_path=weights)  # fmt: skip

    # a pass places it; the node's socket hears the doorbell and the agent starts the engine
    reconcile.run_pass()
    wait_for(lambda: shard_state(model) == "ready", "the engine becoming ready", logs=logs)
    reconcile.run_pass()
    [replica] = replicas(model)
    assert replica.state == ReplicaState.READY
    first = Shard.objects.get(replica=replica, desired_state="running")
    [(pid, _env)] = state.find_marked(state_dir).values()

    # the engine is killed: the agent reports it failed with its exit code
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: shard_state(model) == "failed", "the shard reported failed", logs=logs)
    reconcile.run_pass()
    replica.refresh_from_db()
    assert replica.state == ReplicaState.FAILED
    assert "restart in 10 s" in replica.reason

    # not before the backoff; after it, a new shard on the same node becomes ready
    reconcile.run_pass(timezone.now() + timedelta(seconds=5))
    assert not Shard.objects.filter(replica=replica, desired_state="running").exists()
    reconcile.run_pass(timezone.now() + timedelta(seconds=11))
    wait_for(lambda: shard_state(model) == "ready", "the restarted engine ready", logs=logs)
    second = Shard.objects.get(replica=replica, desired_state="running")
    assert second.pk != first.pk and second.node_id == "cpu-live"
    assert [p for p, _ in state.find_marked(state_dir).values()] != [pid]
