"""Shards on the wire: the set a node should run, and how each of its shards stands.

The control plane sends the full desired set (``Desired``: each shard with its
profile and LoRA adapters); the agent reports each shard's state
(``ShardStatus``, with the adapters its engine holds) and, on register, the
shards it runs (``RunningShard``), so the control plane adopts them. This module
changes when what is said about running shards changes.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from pydantic import Field

from agentd.protocol.fields import (
    Count,
    GpuIndex,
    Int32,
    Msg,
    Part,
    Sha256Hex,
    ShardId,
    ShortStr,
    SmallCount,
    Text,
)


class ShardState(enum.StrEnum):
    """A shard's lifecycle, reported by the agent (the seed's states)."""

    PENDING = "pending"
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    # Its engine released its GPU memory and waits to be woken (docs/engines.md,
    # "Sleep and wake"); an engine that sleeps by stopping has no process then.
    ASLEEP = "asleep"
    STOPPED = "stopped"
    FAILED = "failed"


def shard_state_from_wire(value: str) -> ShardState:
    """A reported state; an unknown one is FAILED.

    A newer agent reporting something this control plane does not understand
    must not be mistaken for a healthy shard.
    """
    try:
        return ShardState(value)
    except ValueError:
        return ShardState.FAILED


class RunningShard(Part):
    """A shard the agent is running, reported on register so the control plane adopts it."""

    shard_id: ShardId
    replica_id: ShortStr = ""
    rank: GpuIndex = 0
    gpu_uuids: Annotated[list[ShortStr], Field(max_length=64)] = []
    hcas: Annotated[list[ShortStr], Field(max_length=64)] = []
    # A multi-node shard's group size and the fabric its HCAs are on ("": none).
    nnodes: Annotated[int, Field(ge=1)] = 1
    fabric: ShortStr = ""
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    state: Annotated[str, Field(max_length=32)]
    model: ShortStr = ""
    profile: ShortStr = ""
    pid: Int32 | None = None


class AdapterStatus(Part):
    """A LoRA adapter as a shard's engine holds it: loading, loaded, or failed and why."""

    name: ShortStr
    # Free text, like a shard's state: a newer agent's state is shown, not refused.
    state: Annotated[str, Field(min_length=1, max_length=16)]
    error: Text = ""
    # The engine's own number for it, where requests name it so (llama.cpp's "lora" id).
    id: SmallCount | None = None


class ShardStatus(Msg):
    type: Literal["shard_status"]
    shard_id: ShardId
    replica_id: ShortStr = ""
    # Free text on purpose: an unknown state is read as failed, not refused.
    state: Annotated[str, Field(min_length=1, max_length=32)]
    error: Text = ""
    exit_code: Int32 | None = None
    last_output: Annotated[list[Text], Field(max_length=200)] = []
    # The adapters its engine holds now; None: no news (an older agent, or unchanged).
    adapters: Annotated[list[AdapterStatus], Field(max_length=64)] | None = None


class ProfileSpec(Part):
    name: ShortStr
    engine: Annotated[str, Field(min_length=1, max_length=32)]
    gpu_class: ShortStr = ""
    tp: Annotated[int, Field(ge=1)] = 1
    pp: Annotated[int, Field(ge=1)] = 1
    gpus_per_node: Count = 0
    nodes: Annotated[int, Field(ge=1)] = 1
    args: Annotated[list[Text], Field(max_length=256)] = []
    env: Annotated[dict[ShortStr, Text], Field(max_length=256)] = {}
    # A local path (on the node or a shared filesystem), an https:// URL of one
    # file, or hf://org/name[/path][@revision]; the agent fetches the last two first.
    model_path: Annotated[str, Field(max_length=1024)] = ""
    served_model_name: ShortStr = ""
    # Optional checksums of the fetched files: file name (for a URL, its last
    # path part; for a hub repository, the path in the repository) -> hex sha256.
    weights_sha256: Annotated[
        dict[Annotated[str, Field(max_length=1024)], Sha256Hex], Field(max_length=4096)
    ] = {}
    # GB of each GPU the engine may use where the profile shares GPUs (the shard's
    # gpu_memory_fraction says it as a part of the GPU); None: whole GPUs.
    gpu_memory_gb: Annotated[float, Field(gt=0, le=1024)] | None = None
    # LoRA adapters a replica holds at once; 0: LoRA off (the engine starts without it).
    max_adapters: Annotated[int, Field(ge=0, le=64)] = 0


class AdapterSpec(Part):
    """A LoRA adapter a shard's engine should hold: fetched like weights, then loaded."""

    name: ShortStr
    # As a profile's model_path: a local path, an https:// URL, or hf://org/name[...].
    source: Annotated[str, Field(min_length=1, max_length=1024)]
    sha256: Annotated[
        dict[Annotated[str, Field(max_length=1024)], Sha256Hex], Field(max_length=256)
    ] = {}


class DesiredShard(Part):
    shard_id: ShardId
    replica_id: ShortStr
    model: ShortStr
    # running: start or keep (or wake); draining: finish in-flight work, take no more;
    # asleep: finish in-flight work, then release the GPUs (sleep_level); stopped: stop.
    state: Literal["running", "draining", "asleep", "stopped"]
    rank: Count = 0
    nnodes: Annotated[int, Field(ge=1)] = 1
    leader_addr: ShortStr = ""
    leader_port: Annotated[int, Field(ge=0, le=65535)] = 0
    gpu_uuids: Annotated[list[ShortStr], Field(max_length=64)] = []
    hcas: Annotated[list[ShortStr], Field(max_length=64)] = []
    # Multi-node only, fixed when the replica was placed: this node's management
    # interface, and the fabric placement chose (the one ``hcas`` are on).
    mgmt_interface: ShortStr = ""
    fabric: ShortStr = ""
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    startup_timeout_s: Annotated[float, Field(gt=0)] = 1800
    # A profile that shares GPUs (gpu_memory_gb): the part of each of this shard's
    # GPUs its engine may use, its budget over the GPU's total. 0: whole GPUs.
    gpu_memory_fraction: Annotated[float, Field(ge=0, le=1)] = 0
    # The same budget for llama.cpp, as the layers to offload to those GPUs (from the
    # model's estimate); -1: not told (whole GPUs, or no estimate).
    gpu_layers: Annotated[int, Field(ge=-1, le=100_000)] = -1
    # vLLM on a CPU node: GiB of the node's memory for its KV cache
    # (VLLM_CPU_KVCACHE_SPACE), from the model's estimate; 0: not told (vLLM's default).
    kv_cache_gb: Annotated[int, Field(ge=0, le=100_000)] = 0
    # Its model's sleep level (docs/engines.md, "Sleep and wake"): 1 keeps the weights
    # in host memory, 2 drops them; 0: the model never sleeps. An engine that sleeps
    # through its API is started ready for it (vLLM: --enable-sleep-mode).
    sleep_level: Annotated[int, Field(ge=0, le=2)] = 0
    # llama.cpp over nodes: the followers' ggml-rpc-servers, "address:port" by rank
    # (1, 2, …), which the leader names in --rpc and each follower listens on.
    rpc_servers: Annotated[list[ShortStr], Field(max_length=64)] = []
    profile: ProfileSpec
    # The model's LoRA adapters this replica should hold, most recently asked for first,
    # at most profile.max_adapters. A change loads and unloads them; it is no new spec.
    adapters: Annotated[list[AdapterSpec], Field(max_length=64)] = []


class Desired(Msg):
    """The full set of shards this node should have. Newer versions replace older ones."""

    type: Literal["desired"]
    version: Count
    shards: Annotated[list[DesiredShard], Field(max_length=256)] = []
