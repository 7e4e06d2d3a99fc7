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
from dataclasses import dataclass

from ..units import MB_PER_GB, share_mb


@dataclass(frozen=True)
class GpuFact:
    node: str
    uuid: str
    name: str  # as NVML reports it: what CostHour.gpu_class keeps
    memory_mb: int  # MiB; 0: not reported


@dataclass(frozen=True)
class NodeFact:
    id: str
    memory_mb: int | None  # MemTotal, decimal MB; None: not reported


@dataclass(frozen=True)
class Holder:
    """One placed shard that holds what it was given (its process not finished)."""

    node: str
    gpus: tuple[str, ...]  # the uuids it holds; empty for a CPU shard
    model: str
    team: str = ""
    share_gb: float | None = None  # its profile's gpu_memory_gb: None, whole GPUs
    host_gb: float | None = None  # its profile's min_memory_gb, for CPU-only nodes
    asleep: bool = False


@dataclass(frozen=True, order=True)
class Owner:
    """A CostHour's key within its hour: idle, or a model of a team, on a GPU class."""

    idle: bool
    gpu_class: str
    model: str = ""
    team: str = ""


def attribute(
    nodes: list[NodeFact], gpus: list[GpuFact], holders: list[Holder]
) -> dict[Owner, float]:
    """What each owner holds now, in GPUs (or CPU-only nodes); the values add up to the
    fleet's GPUs plus its CPU-only nodes exactly."""
    by_gpu: dict[tuple[str, str], GpuFact] = {(g.node, g.uuid): g for g in gpus}
    with_gpus = {g.node for g in gpus}
    known = {n.id: n for n in nodes}
    on_gpu: dict[tuple[str, str], list[tuple[Owner, float]]] = defaultdict(list)
    on_node: dict[str, list[tuple[Owner, float]]] = defaultdict(list)
    for h in holders:
        if h.asleep or h.node not in known:
            continue
        if h.gpus:
            for uuid in h.gpus:
                gpu = by_gpu.get((h.node, uuid))
                if gpu is None:
                    continue  # a GPU the node no longer reports: nothing to price
                part = 1.0
                if h.share_gb and gpu.memory_mb:
                    part = min(1.0, share_mb(h.share_gb) / gpu.memory_mb)
                on_gpu[(h.node, uuid)].append((Owner(False, gpu.name, h.model, h.team), part))
        elif h.node not in with_gpus:
            memory = known[h.node].memory_mb
            part = 1.0
            if h.host_gb and memory:
                part = min(1.0, h.host_gb * MB_PER_GB / memory)
            on_node[h.node].append((Owner(False, "", h.model, h.team), part))
    held: dict[Owner, float] = defaultdict(float)
    for key, gpu in by_gpu.items():
        if gpu.node in known:
            _split(held, on_gpu.get(key, ()), Owner(True, gpu.name))
    for node in nodes:
        if node.id not in with_gpus:
            _split(held, on_node.get(node.id, ()), Owner(True, ""))
    return dict(held)


def _split(held: dict, parts, idle: Owner) -> None:
    """One GPU (or node) among its holders, scaled down past a whole one; the rest idle."""
    total = sum(p for _, p in parts)
    scale = 1.0 / total if total > 1.0 else 1.0
    for owner, p in parts:
        held[owner] += p * scale
    left = 1.0 - total * scale
    if left > 1e-12:
        held[idle] += left
