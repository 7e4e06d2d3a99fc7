"""Reliability row 10: fencing. A replayed stale desired set changes nothing; a
replayed current one changes nothing but its ack; only a newer one acts.

The real agent (``agentd.agent.Agent``) over a real supervisor running the fake
engine as a process; the messages are handed to it as the socket would, so a
replay is exact. The version survives a restart of the agent, and the fence with it.
"""

import asyncio
import os
import signal
import time

from agentd.agent import Agent
from agentd.config import parse_config
from agentd.discovery import Machine
from agentd.supervised import SupervisedShards
from tests.e2e.helpers import engine_processes
from tests.engines.helpers import Recorder, desired, fake_supervisor, shard
from tests.processes import port_block


def make_agent(tmp_path, state_dir, ports) -> tuple[Agent, Recorder]:
    cfg = parse_config(
        {
            "control_plane_url": "ws://cp.test/ws/agent/",
            "join_token": "jt_test",
            "node_id": "cpu-fence",
            "state_dir": str(state_dir),
            "weights_dirs": [],
        }
    )
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2113024000 kB\n")
    machine = Machine(
        state_dir=state_dir,
        weights_dirs=[],
        meminfo=meminfo,
        mounts_file=tmp_path / "no-mounts",
        infiniband=tmp_path / "no-ib",
    )
    recorder = Recorder()
    agent = Agent(cfg, machine=machine)

    async def on_event(msg):
        await recorder(msg)
        await agent.on_shard_event(msg)

    agent.shards = SupervisedShards(fake_supervisor(state_dir, on_event, port_range=ports))
    # Everything the agent sends, as it sends it: its outbox coalesces (a newer
    # desired ack replaces an unsent older one), so counting what waits there
    # would count replies, not what the agent did.
    agent.sent_log = []
    queue = agent.send

    def send(msg):
        agent.sent_log.append(msg)
        queue(msg)

    agent.send = send
    return agent, recorder


def acks(agent) -> list[int]:
    return [m.version for m in agent.sent_log if m.type == "ack" and m.of == "desired"]


async def settle(agent, count: int, timeout: float = 20) -> None:
    """Wait until the agent has sent ``count`` desired acks, then a little longer."""
    deadline = time.monotonic() + timeout
    while len(acks(agent)) < count:
        assert time.monotonic() < deadline, f"acks so far: {acks(agent)}"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # anything a message set off has had time to begin


async def test_replayed_desired_sets_stale_ones_change_nothing_duplicates_only_ack(
    tmp_path, record
):
    state_dir = (tmp_path / "state").resolve()
    state_dir.mkdir()
    try:
        await replay_scenario(tmp_path, state_dir, record)
    finally:
        # Engines outlive their agent by design; none may outlive the test.
        for _sid, pid in engine_processes(state_dir):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def replay_scenario(tmp_path, state_dir, record) -> None:
    ports = port_block(10)
    running = shard("s1", port=ports[0])
    v5, v4, v6 = desired(5, running), desired(4), desired(6)
    replays = {"stale": 0, "duplicate": 0}
    effects = 0  # times the engines differed from before, after a replay
    agent, recorder = make_agent(tmp_path, state_dir, ports)
    await agent.start()
    try:
        # given: desired set v5 runs one shard on the fake engine
        await agent.handle(v5)
        await recorder.wait_for("s1", "ready")
        await settle(agent, 1)
        engines = engine_processes(state_dir)
        assert [sid for sid, _ in engines] == ["s1"]

        # when: v4 (which would stop it) is replayed, and v5 again, five times each
        for _ in range(5):
            await agent.handle(v4)
            replays["stale"] += 1
            await agent.handle(v5)
            replays["duplicate"] += 1
        await settle(agent, 6)

        # then: the stale one changed nothing and was not acked; each duplicate was
        # acked again and changed nothing
        assert acks(agent) == [5] * 6
        assert agent.desired_version == 5
        effects += engine_processes(state_dir) != engines
        assert engine_processes(state_dir) == engines
        assert recorder.states("s1")[-1] == "ready"
    finally:
        await agent.close()

    # when: the agent restarts (its engine runs on) and both are replayed again
    agent, recorder = make_agent(tmp_path, state_dir, ports)
    await agent.start()
    try:
        assert agent.desired_version == 5
        await agent.handle(v4)
        await agent.handle(v5)
        replays["stale"] += 1
        replays["duplicate"] += 1
        await settle(agent, 1)
        assert acks(agent) == [5]
        effects += engine_processes(state_dir) != engines
        assert engine_processes(state_dir) == engines, "the fence survives a restart"
        starts = sum(
            1 for m in agent.sent_log if m.type == "shard_status" and m.state == "starting"
        )

        # and a newer set does act: v6 stops the engine
        await agent.handle(v6)
        await settle(agent, 2)
        deadline = time.monotonic() + 20
        while engine_processes(state_dir) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        stopped = not engine_processes(state_dir)
    finally:
        await agent.close()

    record(
        "10",
        stale_replays=replays["stale"],
        replay_effects=effects,
        duplicate_replays=replays["duplicate"],
        duplicate_acks=replays["duplicate"],
        engine_starts_after_restart=starts,
        newer_version_acted=stopped,
    )
    assert starts == 0
    assert stopped
