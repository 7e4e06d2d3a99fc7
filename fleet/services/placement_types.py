"""What placement works with and answers: facts about nodes and GPUs, requests, outcomes.

Plain values with no decisions in them; ``fleet.services.placement`` decides,
with ``placement_fit``'s reasons. Kept apart so the decision logic reads on its
own; callers import these from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from fleet.selectors import Requirement

from .units import MB_PER_GB

BINPACK, SPREAD = "binpack", "spread"
# How many nodes a pending reason names one by one before it summarises.
REASONS_LISTED = 8


@dataclass
class GpuInfo:
    uuid: str
    index: int
    name: str = ""
    healthy: bool = True
    nvlink_peers: frozenset[int] = frozenset()
    numa_node: int | None = None
    memory_mb: int = 0  # the GPU's total in MiB, as NVML reports it (so are the two below)
    other_mb: int = 0  # in use by what llmgw did not promise (other processes)
    promised_mb: int = 0  # promised to shards that share it (profiles with gpu_memory_gb)

    def room_mb(self, reserve_mb: int) -> int:
        """What a share may still be promised here."""
        return self.memory_mb - reserve_mb - self.other_mb - self.promised_mb


@dataclass(frozen=True)
class InstallInfo:
    """An engine's install on a node that is not (yet) installed, as the agent reported it."""

    state: str
    version: str = ""
    detail: str = ""
    progress_percent: int | None = None


@dataclass
class NodeInfo:
    """One node as placement sees it: reported facts, operator intent, and what is in use."""

    id: str
    state: str = "ready"
    cordoned: bool = False
    draining: bool = False
    connected: bool = True
    labels: dict = field(default_factory=dict)
    memory_mb: int | None = None  # None: the agent did not say; still usable
    engines: dict = field(default_factory=dict)
    installs: dict[str, InstallInfo] = field(default_factory=dict)  # engine -> not installed
    vllm_build: str = "auto"
    gpus: list[GpuInfo] = field(default_factory=list)
    fabrics: dict[str, list[str]] = field(default_factory=dict)  # fabric -> HCAs
    weights: frozenset[str] = frozenset()
    # Fetched entries' sources (https://…, hf://…) and sizes by path and by source.
    weight_sources: frozenset[str] = frozenset()
    weight_sizes: dict[str, int] = field(default_factory=dict, repr=False)
    # (path, source) of entries the node is removing now (a clean-up proposal on its
    # socket, reply awaited): a shard needing them is not placed here meanwhile.
    removing: tuple[tuple[str, str], ...] = ()
    port_range: tuple[int, int] | None = None  # None: the snapshot's default
    used_gpus: set[str] = field(default_factory=set)
    used_ports: set[int] = field(default_factory=set)
    promised_mb: int = 0  # memory that shards already placed here asked for
    asleep_mb: int = 0  # host memory sleeping replicas hold (their weights, at level 1)
    shards: int = 0
    by_class: dict[str, list[GpuInfo]] = field(default_factory=dict, repr=False)

    @property
    def free_gpus(self) -> int:
        """Healthy GPUs nothing uses: neither a whole-GPU shard nor a share."""
        return sum(
            1 for g in self.gpus if g.healthy and g.uuid not in self.used_gpus and not g.promised_mb
        )


@dataclass(frozen=True)
class Request:
    """What one replica needs, from its engine profile and model."""

    model: str
    engine: str
    gpus_per_node: int = 0
    # A share of each of those GPUs, in MiB (gpu_memory_gb); 0: whole GPUs.
    gpu_memory_mb: int = 0
    nodes: int = 1
    tp: int = 1
    gpu_class: str = ""
    min_memory_gb: int | None = None
    # Whole GPUs: the memory each must have, from the model's estimate (0: any).
    min_gpu_mb: int = 0
    selector: tuple[Requirement, ...] = ()
    selector_text: str = ""
    model_path: str = ""
    policy: str = BINPACK
    # Nodes this replica failed on too often, with the count: tried only when
    # nothing else fits.
    avoid: tuple[tuple[str, int], ...] = ()
    # Nodes to try first: where a restarted replica ran, its weights are there.
    prefer: tuple[str, ...] = ()

    @cached_property
    def avoided(self) -> dict[str, int]:
        return dict(self.avoid)

    @property
    def static_key(self) -> tuple:
        return (
            self.engine,
            self.gpus_per_node,
            self.gpu_memory_mb,
            self.gpu_class,
            self.min_memory_gb,
            self.min_gpu_mb,
            self.selector,
        )

    @property
    def need_mb(self) -> int:
        return (self.min_memory_gb or 0) * MB_PER_GB


@dataclass(frozen=True)
class ShardPlacement:
    node_id: str
    rank: int
    gpu_uuids: tuple[str, ...]
    port: int
    hcas: tuple[str, ...] = ()
    nvlink: bool = False


@dataclass(frozen=True)
class Placement:
    shards: tuple[ShardPlacement, ...]
    fabric: str = ""
    holds_weights: bool = False

    @property
    def node_ids(self) -> list[str]:
        return [s.node_id for s in self.shards]


@dataclass(frozen=True)
class Reason:
    node_id: str
    kind: str  # groups reasons in a summary: "memory", "gpus", "cordoned"…
    text: str  # the whole sentence, node first: "gpu-07: has 8 GB of memory, needs 24"


@dataclass(frozen=True)
class NoPlacement:
    reasons: tuple[Reason, ...]
    total_nodes: int
    extra: str = ""  # a reason that is not about one node (multi-node fabric)

    @property
    def summary(self) -> str:
        if not self.total_nodes:
            return "no nodes are registered"
        if self.extra and not self.reasons:
            return self.extra
        lead = self.extra + " — " if self.extra else ""
        if len(self.reasons) <= REASONS_LISTED:
            head = "" if self.extra else "no node fits: "
            return lead + head + "; ".join(r.text for r in self.reasons)
        by_kind: dict[str, list[Reason]] = {}
        for r in self.reasons:
            by_kind.setdefault(r.kind, []).append(r)
        parts = [
            f"{len(rs)} {_KIND_TEXT.get(kind, kind)}, e.g. {rs[0].text}"
            for kind, rs in sorted(by_kind.items(), key=lambda kv: -len(kv[1]))
        ]
        head = (
            f"of the others, {len(self.reasons)}"
            if self.extra
            else (f"none of {self.total_nodes} nodes fits")
        )
        return f"{lead}{head}: " + "; ".join(parts)


_KIND_TEXT = {
    "state": "are not ready",
    "connected": "have no agent connected",
    "cordoned": "are cordoned",
    "selector": "do not match the selector",
    "memory": "have too little memory",
    "engine": "lack the engine",
    "gpu_class": "lack the GPU class",
    "gpus": "have too few free GPUs",
    "gpu_memory": "have no GPU with that much memory left",
    "ports": "have no free port",
    "avoid": "failed this replica before",
    "fabric": "share no fabric with enough nodes",
}


@dataclass(frozen=True)
class Verdict:
    """One node's answer to "could it run this?", for ``explain``."""

    node_id: str
    fits: bool
    text: str
