"""Who holds what of the fleet now: pure, facts in and GPU-equivalents out, no database.

A GPU held whole counts 1 for its holder; a share counts the memory its profile
asks (``gpu_memory_gb``) over the GPU's memory, as placement promises it; what
no replica holds of a GPU is idle, under its GPU's name. Shares that would add
up past a whole GPU (an over-committed GPU, which placement does not make) are
scaled down so that a GPU is never counted more than once.

A node without GPUs is priced by the node-hour: its replicas count the host
memory their profile asks (``min_memory_gb``) over the node's, or the whole
node where either is unknown, scaled down the same way; the rest is idle under
the class "" (a CPU-only node).

An asleep replica holds no GPU: the GPUs it gave back are idle, or held by
whoever took them. The host memory it keeps asleep is not priced: a GPU node's
price is its GPUs', and nothing is invented for its memory. A CPU replica on a
node with GPUs counts nothing either: that node is priced by its GPUs.
"""

from collections import defaultdict
from typing import NamedTuple

from ..units import MB_PER_GB, share_mb

# Named tuples, not dataclasses: a count at 5,000 nodes makes 40,000 GPU facts and
# hashes as many keys, and tuples are made and hashed in C.


class GpuFact(NamedTuple):
    node: str
    uuid: str
    name: str  # as NVML reports it: what CostHour.gpu_class keeps
    memory_mb: int  # MiB; 0: not reported


class NodeFact(NamedTuple):
    id: str
    memory_mb: int | None  # MemTotal, decimal MB; None: not reported


class Holder(NamedTuple):
    """One placed shard that holds what it was given (its process not finished)."""

    node: str
    gpus: tuple  # the uuids it holds; empty for a CPU shard
    model: str
    team: str = ""
    share_gb: float | None = None  # its profile's gpu_memory_gb: None, whole GPUs
    host_gb: float | None = None  # its profile's min_memory_gb, for CPU-only nodes
    asleep: bool = False


class Owner(NamedTuple):
    """A CostHour's key within its hour: idle, or a model of a team, on a GPU class."""

    idle: bool
    gpu_class: str
    model: str = ""
    team: str = ""


def attribute(
    nodes: list[NodeFact], gpus: list[GpuFact], holders: list[Holder]
) -> dict[Owner, float]:
    """What each owner holds now, in GPUs (or CPU-only nodes); the values add up to the
    fleet's GPUs plus its CPU-only nodes exactly.

    Facts are read by position, so plain rows of the same shape do (the accrual
    passes its query's rows as they come), and keys are plain tuples until the end.
    """
    memory = {nid: mem for nid, mem in nodes}
    by_gpu = {(n, u): (name or "", mem or 0) for n, u, name, mem in gpus if n in memory}
    with_gpus = {g[0] for g in gpus}
    on_gpu: dict[tuple[str, str], list] = defaultdict(list)
    on_node: dict[str, list] = defaultdict(list)
    for node, uuids, model, team, share_gb, host_gb, asleep in holders:
        if asleep or node not in memory:
            continue
        if uuids:
            share = share_mb(share_gb) if share_gb else 0
            for uuid in uuids:
                gpu = by_gpu.get((node, uuid))
                if gpu is None:
                    continue  # a GPU the node no longer reports: nothing to price
                name, total = gpu
                part = min(1.0, share / total) if share and total else 1.0
                on_gpu[(node, uuid)].append(((False, name, model, team), part))
        elif node not in with_gpus:
            mem = memory[node]
            part = min(1.0, host_gb * MB_PER_GB / mem) if host_gb and mem else 1.0
            on_node[node].append(((False, "", model, team), part))
    held: dict[tuple, float] = defaultdict(float)
    # The GPUs nobody holds (most of a fleet's, often) counted by name in one pass.
    unheld: dict[str, int] = defaultdict(int)
    for key, (name, _) in by_gpu.items():
        parts = on_gpu.get(key)
        if parts:
            _split(held, parts, (True, name, "", ""))
        else:
            unheld[name] += 1
    for name, n in unheld.items():
        held[(True, name, "", "")] += n
    for nid in memory:
        if nid not in with_gpus:
            _split(held, on_node.get(nid, ()), (True, "", "", ""))
    return {Owner(*key): amount for key, amount in held.items()}


def _split(held: dict, parts, idle: tuple) -> None:
    """One GPU (or node) among its holders, scaled down past a whole one; the rest idle."""
    total = sum(p for _, p in parts)
    scale = 1.0 / total if total > 1.0 else 1.0
    for owner, p in parts:
        held[owner] += p * scale
    left = 1.0 - total * scale
    if left > 1e-12:
        held[idle] += left
