"""Reliability rows 1 and 2: the agent dies under a steady load of requests.

Engines outlive their agent by design; a restarted agent adopts them (by its
state file, or by the mark in their environment when the state dir is gone),
so clients notice nothing and nothing is restarted or started twice.
"""

import shutil
import time

import pytest
import yaml

from fleet.models import Node, Shard
from tests.e2e.helpers import apply_model, engine_processes, live_shards, wait_passes, wait_serving
from tests.processes import Load

pytestmark = pytest.mark.django_db(transaction=True)


def registered_at(node_id):
    node = Node.objects.filter(pk=node_id, connected=True).first()
    return node.registered_at if node else None


def restart_and_wait(stack, agent) -> float:
    """Start the agent again; seconds until it has registered anew."""
    before = Node.objects.get(pk=agent.node_id).registered_at
    started = time.monotonic()
    agent.start()
    stack.wait(
        lambda: (at := registered_at(agent.node_id)) and at > before,
        f"{agent.node_id} to register again",
    )
    return time.monotonic() - started


def test_agent_killed_9_ten_times_in_a_row_under_load_restarts_nothing(stack, tiny_model, record):
    # given: the model served by one agent, and clients calling it steadily
    agent = stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    (shard,) = wait_serving(stack)
    engines = agent.engines()
    back_s = []

    with Load(stack.url, stack.inference_key, clients=4) as load:
        load.wait_requests(20)
        # when: the agent is killed -9 and started again, ten times in a row
        for _ in range(10):
            agent.kill_9()
            load.wait_requests(4)  # requests go on while no agent watches
            back_s.append(restart_and_wait(stack, agent))
            load.wait_requests(4)
        wait_passes(stack, 3)
        load.wait_requests(20)
    figures = load.summary()

    # then: the same engine process serves throughout, never restarted, never doubled
    restarts = Shard.objects.get(pk=shard.pk).replica.restarts
    record(
        "1",
        kills=10,
        same_engine_pids=agent.engines() == engines,
        engine_processes=len(engine_processes(agent.state_dir)),
        restarts=restarts,
        register_again_max_s=round(max(back_s), 1),
        **figures,
    )
    assert agent.engines() == engines
    assert engine_processes(agent.state_dir) == sorted((k, v) for k, v in engines.items())
    assert restarts == 0
    assert [s.pk for s in live_shards()] == [shard.pk]
    assert figures["failed"] == 0 and figures["broken"] == 0, figures


def test_agent_state_dir_wiped_and_restarted_adopts_its_engine_by_its_mark(
    stack, tiny_model, record
):
    # given: the model served by one agent whose credential lives outside its state dir
    agent = stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    (shard,) = wait_serving(stack)
    engines = agent.engines()

    with Load(stack.url, stack.inference_key, clients=4) as load:
        load.wait_requests(20)
        # when: the agent dies, its whole state dir is wiped (state file, desired
        # version, shard logs), and it is started again
        agent.kill_9()
        credential = agent.dir / "credential"
        shutil.copy(agent.state_dir / "credential", credential)
        config = yaml.safe_load(agent.config.read_text())
        config["credential_file"] = str(credential)
        agent.config.write_text(yaml.safe_dump(config))
        shutil.rmtree(agent.state_dir)
        back_s = restart_and_wait(stack, agent)
        wait_passes(stack, 3)
        load.wait_requests(20)
    figures = load.summary()

    # then: it found its engine by the mark in its environment, and started no second one
    found = engine_processes(agent.state_dir)
    restarts = Shard.objects.get(pk=shard.pk).replica.restarts
    record(
        "2",
        engine_processes=len(found),
        duplicates=len(found) - len(engines),
        same_engine_pids=agent.engines() == engines,
        restarts=restarts,
        register_again_s=round(back_s, 1),
        **figures,
    )
    assert found == sorted(engines.items())
    assert [s["shard_id"] for s in Node.objects.get(pk="cpu-a").running_shards] == [shard.pk]
    again = Shard.objects.get(pk=shard.pk)
    assert (again.state, again.desired_state, restarts) == ("ready", "running", 0)
    assert [s.pk for s in live_shards()] == [shard.pk]
    assert "adopting engine pid" in agent.proc.output()
    assert figures["failed"] == 0 and figures["broken"] == 0, figures
