"""Load from psutil, with real processes in their own process groups."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from agentd.load import LoadSampler, group_processes

# A leader that forks a child (same group) and a grandchild that leaves the
# group (setsid), each holding 40 MB; the leader also spins on the CPU.
ENGINE = """
import os, sys, time
block = bytearray(40 * 2**20)
for i in range(0, len(block), 4096): block[i] = 1
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()  # a process that left the engine's group is not the engine's
        other = bytearray(40 * 2**20)
        for i in range(0, len(other), 4096): other[i] = 1
        os.write(w, b"x")
        time.sleep(60); os._exit(0)
    time.sleep(60); os._exit(0)
os.read(r, 1)  # all three are in place
print("up", flush=True)
while True: pass
"""


@pytest.fixture
def engine():
    proc = subprocess.Popen(
        [sys.executable, "-c", ENGINE], start_new_session=True, stdout=subprocess.PIPE
    )
    assert proc.stdout.readline() == b"up\n"
    yield proc
    pgid = proc.pid
    for p in psutil.Process(pgid).children(recursive=True):
        p.kill()
    os.killpg(pgid, 9)
    proc.wait()


@pytest.mark.live
def test_a_shards_group_is_its_leader_and_the_descendants_still_in_it(engine):
    pids = {p.pid for p in group_processes(engine.pid)}
    family = {engine.pid, *(c.pid for c in psutil.Process(engine.pid).children(recursive=True))}
    assert engine.pid in pids and len(pids) == 2
    assert len(family) == 3  # the one that called setsid is left out


@pytest.mark.live
def test_shard_cpu_and_rss_come_from_its_process_group(engine):
    sampler = LoadSampler()
    first = sampler.sample({"shard-a": engine.pid})
    assert first.shards[0].cpu_cores == 0  # no interval yet to measure over
    cpu_before = psutil.Process(engine.pid).cpu_times()
    time.sleep(0.5)
    load = sampler.sample({"shard-a": engine.pid, "gone": 2**22 + 12345})
    cpu_after = psutil.Process(engine.pid).cpu_times()

    (shard,) = load.shards  # a group with no process left is left out, not zero
    assert shard.shard_id == "shard-a"
    spun = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    assert spun > 0 and shard.cpu_cores > 0
    # two processes of the group with 40 MB each; not the third, which left it
    assert 80 * 2**20 <= shard.rss_bytes < 115 * 2**20


def test_machine_load():
    load = LoadSampler().sample()
    vm = psutil.virtual_memory()
    assert load.cpu_count == psutil.cpu_count()
    assert 0 <= load.cpu_percent <= 100
    assert load.memory_used_bytes + load.memory_available_bytes == vm.total
    assert load.load1 >= 0 and load.shards == []


@pytest.mark.live
def test_a_shards_gpu_memory_is_its_groups_on_the_gpu_it_uses_most(engine):
    """NVML lists pids; the shard's figure is its group's sum on its busiest GPU, in MiB."""
    child = next(p.pid for p in group_processes(engine.pid) if p.pid != engine.pid)
    by_pid = {
        engine.pid: {"GPU-a": 10 * 2**30, "GPU-b": 3 * 2**30},
        child: {"GPU-a": 2 * 2**30},
        4242: {"GPU-a": 50 * 2**30},  # not the engine's
    }
    load = LoadSampler().sample({"shard-a": engine.pid}, by_pid)
    assert load.shards[0].gpu_memory_mb == 12 * 1024
    # No GPU process of the group listed: not measured, rather than a zero.
    assert LoadSampler().sample({"shard-a": engine.pid}, {}).shards[0].gpu_memory_mb is None
