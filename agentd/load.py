"""How busy the machine and each engine are, sampled between heartbeats.

Cheap on purpose: one psutil call each for CPU and memory, the load averages
from the kernel, and for engines only the processes of their own groups. CPU
figures are averages over the time since the previous sample, so a heartbeat
reports the whole interval rather than an instant.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psutil

from agentd import protocol


@dataclass
class _GroupSample:
    at: float
    cpu_s: dict[int, float] = field(default_factory=dict)  # pid -> user+system seconds


def group_processes(pgid: int) -> list[psutil.Process]:
    """The live processes of a process group: its leader and every descendant still in it.

    An engine runs in its own session, so its group is its leader's pid and
    everything it forks (vLLM's workers, a tokenizer pool) stays in it.
    """
    try:
        leader = psutil.Process(pgid)
        family = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return []
    out = []
    for p in family:
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except OSError:
            continue
    return out


class LoadSampler:
    """Keeps the previous sample so CPU is measured over the interval between calls."""

    def __init__(self):
        psutil.cpu_percent(interval=None)  # the first call only sets the baseline
        self._groups: dict[str, _GroupSample] = {}
        self._cpu_count = psutil.cpu_count(logical=True) or 1

    def sample(
        self,
        groups: dict[str, int] | None = None,
        gpu_processes: dict[int, dict[str, int]] | None = None,
    ) -> protocol.Load:
        """The machine's load, and each shard's from its process group (shard id -> pgid).

        ``gpu_processes`` is NVML's GPU memory by pid (``NVML.process_memory``).
        """
        vm = psutil.virtual_memory()
        load1, load5, load15 = os.getloadavg()
        return protocol.Load(
            cpu_percent=min(100.0, max(0.0, psutil.cpu_percent(interval=None))),
            cpu_count=self._cpu_count,
            load1=load1,
            load5=load5,
            load15=load15,
            memory_used_bytes=vm.total - vm.available,
            memory_available_bytes=vm.available,
            shards=self._shards(groups or {}, gpu_processes or {}),
        )

    def _shards(
        self, groups: dict[str, int], gpu_processes: dict[int, dict[str, int]]
    ) -> list[protocol.ShardLoad]:
        now = time.monotonic()
        out = []
        seen = {}
        for shard_id, pgid in sorted(groups.items()):
            procs = group_processes(pgid)
            if not procs:
                continue  # gone: no figure is better than a zero that looks measured
            cpu: dict[int, float] = {}
            rss = 0
            on_gpu: dict[str, int] = {}  # uuid -> bytes of the group's processes
            for p in procs:
                for uuid, used in gpu_processes.get(p.pid, {}).items():
                    on_gpu[uuid] = on_gpu.get(uuid, 0) + used
            for p in procs:
                try:
                    with p.oneshot():
                        t = p.cpu_times()
                        cpu[p.pid] = t.user + t.system
                        rss += p.memory_info().rss
                except psutil.Error:
                    continue
            prev = self._groups.get(shard_id)
            cores = 0.0
            if prev is not None and now > prev.at:
                # Only processes seen both times: one that started since has no
                # baseline, and one that ended took its seconds with it.
                used = sum(
                    max(0.0, s - prev.cpu_s[pid]) for pid, s in cpu.items() if pid in prev.cpu_s
                )
                cores = used / (now - prev.at)
            seen[shard_id] = _GroupSample(at=now, cpu_s=cpu)
            out.append(
                protocol.ShardLoad(
                    shard_id=shard_id,
                    cpu_cores=cores,
                    rss_bytes=rss,
                    # Its budget is per GPU, so the GPU it uses most is the figure.
                    gpu_memory_mb=max(on_gpu.values()) // 2**20 if on_gpu else None,
                )
            )
        self._groups = seen
        return out
