"""Engines outlive the agent: kill -9 of the supervisor's process, then a new one adopts them."""

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from agentd import protocol, state
from agentd.engines.base import http_get
from tests.engines.helpers import Recorder, desired, fake_supervisor, shard
from tests.processes import ROOT, port_block
from tests.processes.base import wait_for

pytestmark = pytest.mark.live


def run_host(state_dir, port_lo: int, want: protocol.Desired) -> tuple[subprocess.Popen, int]:
    """A supervisor in its own process (the agent's stand-in) that has brought a shard up."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.engines.supervisor_host",
            str(state_dir),
            str(port_lo),
            protocol.dump(want),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("READY "), f"the supervisor host said {line!r}"
    return proc, int(line.split()[1])


def kill_9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


async def test_kill_9_of_the_agent_then_the_same_engine_is_adopted(state_dir):
    lo, _ = port_block(20)
    # what placement chose for a multi-node replica rides along, and must survive
    want = desired(3, shard(mgmt_interface="eno1", fabric="ib0"))
    host, pid = run_host(state_dir, lo, want)
    ticks = state.start_ticks(pid)
    # when the agent dies without a word
    kill_9(host)
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, port_range=(lo, lo + 19))
    await sup.start()
    try:
        # then the new one finds the same engine, ready, without starting anything
        (running,) = sup.running_shards()
        assert (running.shard_id, running.pid, running.state) == ("r1-s0", pid, "ready")
        assert running.replica_id == "r1" and running.model == "tiny-llama"
        # and what the control plane adopts says which fabric its group is on
        assert running.fabric == "ib0"
        assert sup.desired_version == 3
        assert sup.process_groups() == {"r1-s0": pid}
        adopted = sup._shards["r1-s0"].spec
        assert (adopted.mgmt_interface, adopted.fabric) == ("eno1", "ib0")
        # and the desired set arriving again restarts nothing
        assert await sup.apply(want)
        await asyncio.sleep(0.5)
        assert state.start_ticks(pid) == ticks
        assert list(state.find_marked(state_dir)) == ["r1-s0"]
        assert rec.states("r1-s0") == []  # no transition: it never stopped being ready
        status, _ = await http_get("127.0.0.1", running.port, "/health", 2)
        assert status == 200
    finally:
        await sup.close()


async def test_an_engine_that_died_while_the_agent_was_down_is_reported_failed(state_dir):
    lo, _ = port_block(20)
    host, pid = run_host(state_dir, lo, desired(1, shard()))
    kill_9(host)
    os.killpg(pid, signal.SIGKILL)
    # SIGKILL is delivered, not awaited: on a busy machine the engine lingers a moment.
    wait_for(lambda: not state.find_marked(state_dir), "the engine killed -9 to be gone", 10)
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, port_range=(lo, lo + 19))
    await sup.start()
    try:
        failed = rec.last("r1-s0", "failed")
        assert failed is not None
        assert "exit code is unknown" in failed.error
        assert sup.running_shards()[0].state == "failed"
    finally:
        await sup.close()


async def test_with_the_state_file_gone_the_mark_prevents_a_second_copy(state_dir):
    lo, _ = port_block(20)
    want = desired(2, shard())
    host, pid = run_host(state_dir, lo, want)
    kill_9(host)
    (state_dir / state.STATE_FILE).unlink()
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, port_range=(lo, lo + 19))
    await sup.start()
    try:
        (running,) = sup.running_shards()
        assert (running.pid, running.state, running.replica_id) == (pid, "ready", "r1")
        assert await sup.apply(want)
        await asyncio.sleep(0.5)
        # one engine for the shard, the one that was already there
        assert {sid: p for sid, (p, _env) in state.find_marked(state_dir).items()} == {"r1-s0": pid}
    finally:
        await sup.close()


async def test_another_agents_engines_are_not_taken(state_dir, tmp_path):
    lo, _ = port_block(20)
    host, pid = run_host(state_dir, lo, desired(1, shard()))
    kill_9(host)
    other = tmp_path / "other-agent"
    sup = fake_supervisor(other, Recorder())
    await sup.start()
    try:
        assert sup.running_shards() == []
    finally:
        await sup.close()


async def test_adopted_engine_is_still_watched_and_stopped(state_dir):
    lo, _ = port_block(20)
    host, pid = run_host(state_dir, lo, desired(1, shard()))
    kill_9(host)
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, port_range=(lo, lo + 19))
    await sup.start()
    try:
        # not our child any more, but its exit is still seen
        await sup.apply(desired(2, shard(state="stopped")))
        await rec.wait_for("r1-s0", "stopped")
        assert state.start_ticks(pid) is None
    finally:
        await sup.close()
