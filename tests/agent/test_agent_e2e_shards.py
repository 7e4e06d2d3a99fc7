"""A shard through the whole path: control plane -> agent -> engine -> status and load back.

The fake engine stands in for a real one (it is the supervisor's tests' job to
run llama.cpp); what is tested here is the agent between the two: the desired
set arrives, the shard's states reach the database, its process group's load
arrives with heartbeats, and a kill -9 of the agent costs the engine nothing.
"""

import os
import signal
import sys

import pytest
from django.db import transaction

from agentd import state
from tests.factories import join_token
from tests.processes import free_port, start_agent, start_web, wait_until, write_config

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

NODE = "cpu-e2e-s1"


@pytest.fixture
def fast_daphne(transactional_db, tmp_path):
    server = start_web(tmp_path, LLMGW_HEARTBEAT_INTERVAL_S="0.5")
    yield server
    server.stop()


def _desire_fake_shard(port: int):
    from fleet.models import EngineProfile, Model, Replica, Shard
    from fleet.services import desired

    with transaction.atomic():
        model = Model.objects.create(name="tiny-fake")
        profile = EngineProfile.objects.create(
            model=model, name="cpu", engine="fake", args=["--spawn-worker"]
        )
        replica = Replica.objects.create(model=model, profile=profile)
        shard = Shard.objects.create(replica=replica, node_id=NODE, port=port)
        desired.bump_desired([NODE])
    return shard.pk


def _shard(shard_id):
    from fleet.models import Shard

    return Shard.objects.get(pk=shard_id)


def _shard_load(shard_id):
    from fleet.models import ShardLoad

    return ShardLoad.objects.filter(shard_id=shard_id, rss_bytes__gt=0).first()


def _node():
    from fleet.models import Node

    return Node.objects.filter(pk=NODE).first()


def test_a_desired_shard_runs_reports_its_load_and_survives_kill_9_of_the_agent(
    fast_daphne, tmp_path
):
    _, secret = join_token()
    state_dir = tmp_path / "state"
    config = write_config(
        tmp_path,
        fast_daphne.ws_url,
        join_token=secret,
        node_id=NODE,
        engines={"binaries": {"fake": sys.executable}},
    )
    agent = start_agent(config)
    engine_pid = None
    try:
        wait_until(lambda: _node() and _node().connected, what="registration", proc=agent)

        # when: the control plane wants a shard of the fake engine here
        shard_id = _desire_fake_shard(free_port())

        # then: it runs, its state reaches the database, its group's load arrives
        wait_until(
            lambda: _shard(shard_id).state == "ready", what="the shard to be ready", proc=agent
        )
        load = wait_until(lambda: _shard_load(shard_id), what="the shard's load", proc=agent)
        assert load.rss_bytes > 10 * 2**20  # the engine and its worker, both Pythons
        wait_until(lambda: _node().acked_version == _node().desired_version, what="the ack")
        (engine_pid, _env), *_ = state.find_marked(state_dir.resolve()).values()

        # when: the agent is killed without warning, then started again
        agent.proc.send_signal(signal.SIGKILL)
        agent.proc.wait()
        registered = _node().registered_at
        agent = start_agent(
            write_config(
                tmp_path,
                fast_daphne.ws_url,
                node_id=NODE,
                engines={"binaries": {"fake": sys.executable}},
            )
        )
        wait_until(lambda: _node().registered_at > registered, what="re-registration", proc=agent)

        # then: it reported the same engine, still ready, and started no other
        (running,) = _node().running_shards
        assert running["shard_id"] == shard_id and running["pid"] == engine_pid
        assert running["state"] == "ready"
        assert [pid for pid, _ in state.find_marked(state_dir.resolve()).values()] == [engine_pid]
        shard = _shard(shard_id)
        assert shard.state == "ready" and shard.replica.restarts == 0
        # heartbeats from the new agent carry the adopted engine's load; it started nothing
        wait_until(
            lambda: _shard_load(shard_id).sampled_at > registered, what="new load", proc=agent
        )
        assert f"adopted pid {engine_pid}, ready" in agent.output()
        assert ": started " not in agent.output()
    finally:
        agent.kill()
        for pid, _env in state.find_marked(state_dir.resolve()).values():
            os.killpg(pid, signal.SIGKILL)
