"""A node on the wire: what it has (register), how it fares (heartbeats), and its health.

The inventory a node registers with (GPUs, fabrics, storage, weights, engine
installs, running shards), the cheap facts of each heartbeat (memory, load,
new problems), critical GPU events sent the moment the driver delivers them,
and a notice that the node is going away. This module changes when what a node
says about itself changes (docs/protocol.md).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import Field, field_validator

from agentd.protocol.engines import EngineInstall
from agentd.protocol.fields import (
    Count,
    GpuIndex,
    IfName,
    Int32,
    Labels,
    Msg,
    NodeId,
    Part,
    ShardId,
    ShortStr,
    SmallCount,
    Version,
    unique,
)
from agentd.protocol.shards import RunningShard
from agentd.protocol.weights import Weights


class GPU(Part):
    index: GpuIndex
    uuid: Annotated[str, Field(min_length=1, max_length=96)]
    name: ShortStr = ""
    memory_total_mb: SmallCount = 0
    memory_used_mb: SmallCount = 0
    compute_capability: Annotated[str, Field(max_length=16)] = ""
    numa_node: Int32 | None = None
    pci_bus_id: Annotated[str, Field(max_length=32)] = ""
    driver_version: Annotated[str, Field(max_length=32)] = ""
    cuda_version: Annotated[str, Field(max_length=16)] = ""
    nvlink_peers: Annotated[list[GpuIndex], Field(max_length=64)] = []
    ecc_errors: SmallCount = 0
    temperature_c: Int32 | None = None
    problems: Annotated[list[ShortStr], Field(max_length=64)] = []


class Fabric(Part):
    fabric: Annotated[str, Field(min_length=1, max_length=64)]
    hcas: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=64)] = []
    rate_gbps: SmallCount = 0


class Storage(Part):
    path: Annotated[str, Field(min_length=1, max_length=1024)]
    free_bytes: Count
    total_bytes: Count
    shared: bool = False


class ShardLoad(Part):
    shard_id: ShardId
    cpu_cores: Annotated[float, Field(ge=0)]
    rss_bytes: Count
    # GPU memory the group's processes hold on the GPU where they hold the most
    # (NVML, per process). None: not measured (no GPU process of this group seen).
    gpu_memory_mb: SmallCount | None = None


class Load(Part):
    """Machine load sampled between heartbeats."""

    cpu_percent: Annotated[float, Field(ge=0, le=100)]
    cpu_count: Annotated[int, Field(ge=1, le=2**31 - 1)]
    load1: Annotated[float, Field(ge=0)]
    load5: Annotated[float, Field(ge=0)]
    load15: Annotated[float, Field(ge=0)]
    memory_used_bytes: Count
    memory_available_bytes: Count
    shards: Annotated[list[ShardLoad], Field(max_length=256)] = Field(default_factory=list)

    @field_validator("shards")
    @classmethod
    def _one_sample_per_shard(cls, v):
        return unique(v, "shard_id", "shard")


class GPUProblem(Part):
    """A problem found after registration. Without an index it is charged to GPU 0."""

    gpu_index: GpuIndex | None = None
    problem: ShortStr


class Register(Msg):
    type: Literal["register"]
    node_id: NodeId
    hostname: ShortStr = ""
    mgmt_addr: ShortStr = ""
    # The interface mgmt_addr is on ("": not found, or an old agent). Multi-node
    # engines bootstrap over it (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).
    mgmt_interface: IfName = ""
    labels: Labels = {}
    agent_version: Annotated[str, Field(max_length=64)] = ""
    engine_versions: Annotated[dict[ShortStr, ShortStr], Field(max_length=32)] = {}
    # None: the agent did not say (an old agent). Unknown is not zero.
    memory_total_mb: Count | None = None
    gpus: Annotated[list[GPU], Field(max_length=64)] = []
    fabrics: Annotated[list[Fabric], Field(max_length=32)] = []
    storage: Annotated[list[Storage], Field(max_length=64)] = []
    weights: Annotated[list[Weights], Field(max_length=4096)] = []
    provision: Annotated[list[EngineInstall], Field(max_length=32)] = []
    running_shards: Annotated[list[RunningShard], Field(max_length=256)] = []
    # The newest desired-set version the agent has converged to (0: none).
    desired_version: Version = 0

    @field_validator("gpus")
    @classmethod
    def _one_gpu_per_index(cls, v):
        return unique(v, "index", "GPU index")

    @field_validator("provision")
    @classmethod
    def _one_install_per_engine(cls, v):
        return unique(v, "engine", "engine")

    @field_validator("mgmt_addr")
    @classmethod
    def _an_ip_literal(cls, v):
        # The gateway connects here: a name would be resolved by the control
        # plane, to whatever its resolver says, long after this was checked.
        if v:
            try:
                ipaddress.ip_address(v)
            except ValueError:
                raise ValueError(f"{v!r} is not an IP address (no host names)") from None
        return v


class Heartbeat(Msg):
    """Cheap facts, each with its own semantics (see docs/protocol.md).

    Empty lists and dicts default through ``default_factory``: pydantic deep-copies
    a literal ``[]`` default for every field a message leaves out, which was most
    of the cost of reading a heartbeat (docs/benchmarks.md, Agent sockets).
    """

    type: Literal["heartbeat"]
    seq: Count = 0
    # Per GPU, in index order. Empty: no news.
    gpu_memory_used_mb: Annotated[list[SmallCount], Field(max_length=64)] = Field(
        default_factory=list
    )
    new_problems: Annotated[list[GPUProblem], Field(max_length=64)] = Field(default_factory=list)
    # Replaces the node's storage every time it is non-empty.
    storage: Annotated[list[Storage], Field(max_length=64)] = Field(default_factory=list)
    # The weights list counts only when weights_changed: an empty list without
    # the flag is silence, not "this node holds nothing".
    weights_changed: bool = False
    weights: Annotated[list[Weights], Field(max_length=4096)] = Field(default_factory=list)
    memory_total_mb: Count | None = None
    engines_changed: bool = False
    engine_versions: Annotated[dict[ShortStr, ShortStr], Field(max_length=32)] = Field(
        default_factory=dict
    )
    provision_changed: bool = False
    provision: Annotated[list[EngineInstall], Field(max_length=32)] = Field(default_factory=list)
    load: Load | None = None
    desired_version: Version = 0

    @field_validator("provision")
    @classmethod
    def _one_install_per_engine(cls, v):
        return unique(v, "engine", "engine")


class GPUEventReport(Part):
    """One critical event as the driver delivered it (``agentd.xid`` names the kinds)."""

    gpu_index: GpuIndex
    # "xid", "double_bit_ecc", "clock", or the driver's event type in hex: free text, so
    # a newer agent's kind is counted, not refused (one not known is watched only).
    kind: Annotated[str, Field(min_length=1, max_length=32)]
    xid: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None


class GPUSlowdown(Part):
    """A GPU's harmful clock slowdowns now ("HW Thermal Slowdown"); empty: none."""

    gpu_index: GpuIndex
    reasons: Annotated[list[ShortStr], Field(max_length=16)] = []


class GPUEvents(Msg):
    """Critical GPU events (XIDs, double-bit ECC), sent the moment the driver delivers
    them rather than with the next heartbeat, and the GPUs whose harmful slowdowns
    changed. The control plane decides what they mean (docs/operations.md)."""

    type: Literal["gpu_events"]
    events: Annotated[list[GPUEventReport], Field(max_length=256)] = []
    slowdowns: Annotated[list[GPUSlowdown], Field(max_length=64)] = []

    @field_validator("slowdowns")
    @classmethod
    def _one_per_gpu(cls, v):
        return unique(v, "gpu_index", "GPU index")


# A notice further off than a week is not a notice.
NOTICE_MAX_S = 7 * 86400


class NodeNotice(Msg):
    """The node is going away in ``in_s`` seconds (as of sending): its cloud's metadata
    or a file said so. ``in_s`` rather than a time, so the clocks need not agree."""

    type: Literal["node_notice"]
    in_s: Annotated[float, Field(ge=0, le=NOTICE_MAX_S)]
    source: Annotated[str, Field(min_length=1, max_length=64)]
    reason: ShortStr = ""
