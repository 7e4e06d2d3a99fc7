"""Agent protocol v1: the one schema both ends validate against.

Every message is a JSON object with ``type`` and ``v``. Anything that does not
validate closes the socket (see ``CloseCode``) and changes nothing. The control
plane imports this module; this module imports nothing from the control plane.
The messages are defined here; the checks before the schema, the close codes
and ``ProtocolError`` are in ``agentd.wire``, and importable from here too.
Units are in the field names: ``_mb`` mebibytes, ``_bytes`` bytes, ``_s`` seconds.
``docs/protocol.md`` is the prose version of this file.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

# Re-exported (the "X as X" form says so): both ends import the whole contract
# from this module, though how a raw message is checked lives in agentd.wire.
from agentd.wire import VERSION as VERSION
from agentd.wire import CloseCode as CloseCode
from agentd.wire import ProtocolError as ProtocolError
from agentd.wire import decode

# A node id names a channel-layer group and appears in URLs, so it keeps to
# characters that are safe in both.
# The longest an agent waits between two tries to reach its control plane
# (agentd.client.Backoff): the control plane counts on every live agent having
# knocked again within this (fleet.services.reconciler.expiry.Rejoin).
RECONNECT_BACKOFF_CAP_S = 30.0

NODE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
SHARD_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"

# An engine version the fleet may want (fleet.models.WantedEngine, and the agent
# again before it runs pip: a version ends up in pip's requirement and in wheel
# URLs, so nothing that could read as a URL, a path or an option). Empty: the latest.
ENGINE_VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$"
ENGINE_VERSION_MAX = 64


def engine_version_problem(version: str) -> str | None:
    """Why ``version`` is not an engine version to install, or None ("" is the latest)."""
    if version == "" or (
        len(version) <= ENGINE_VERSION_MAX and re.fullmatch(ENGINE_VERSION_PATTERN, version)
    ):
        return None
    return (
        f"{version[:80]!r} is not a version (like 0.11.2 or 0.3.36: letters, digits and "
        f". + ! _ -, at most {ENGINE_VERSION_MAX} characters); nothing was installed"
    )


NodeId = Annotated[str, Field(pattern=NODE_ID_PATTERN)]
ShardId = Annotated[str, Field(pattern=SHARD_ID_PATTERN)]
ShortStr = Annotated[str, Field(max_length=255)]
Text = Annotated[str, Field(max_length=4096)]
# Integers are bounded by the columns they end up in: an unbounded int from the
# wire would pass validation and then fail in the database, after the socket
# had already been told its message was fine.
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]  # a bigint column
# Desired-set versions: room left above any reported one, since the control plane
# continues numbering past what an agent reports (after a database restore).
Version = Annotated[int, Field(ge=0, le=2**62)]
SmallCount = Annotated[int, Field(ge=0, le=2**31 - 1)]  # an integer column
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
GpuIndex = Annotated[int, Field(ge=0, le=32767)]  # a smallint column
Labels = Annotated[dict[Annotated[str, Field(max_length=63)], ShortStr], Field(max_length=64)]
# A network interface's name as Linux allows it (IFNAMSIZ is 16 with the NUL);
# it ends up in engines' environments, so nothing but a name.
IfName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:@-]{0,15}$")]


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


# Strict: "1" is not a number and "yes" is not a boolean; a sender that gets a
# type wrong is told so instead of being guessed at. No NaN or infinity either:
# they are not JSON, and nothing downstream could show or compare them.
_CONFIG = ConfigDict(extra="ignore", frozen=True, strict=True, allow_inf_nan=False)


class _Msg(BaseModel):
    model_config = _CONFIG
    v: Literal[1] = 1


class _Part(BaseModel):
    model_config = _CONFIG


def _unique(items: list, key: str, what: str) -> list:
    """Refuse a list naming the same thing twice: the inventory keeps one row per key."""
    seen = set()
    for item in items:
        value = getattr(item, key)
        if value in seen:
            raise ValueError(f"{what} {value!r} appears more than once")
        seen.add(value)
    return items


# ---- inventory parts ---------------------------------------------------------


class GPU(_Part):
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


class Fabric(_Part):
    fabric: Annotated[str, Field(min_length=1, max_length=64)]
    hcas: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=64)] = []
    rate_gbps: SmallCount = 0


class Storage(_Part):
    path: Annotated[str, Field(min_length=1, max_length=1024)]
    free_bytes: Count
    total_bytes: Count
    shared: bool = False


Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class KeptWeights(_Part):
    """A path the agent kept although the control plane proposed removing it."""

    path: Annotated[str, Field(max_length=1024)]
    reason: Text


class Weights(_Part):
    path: Annotated[str, Field(min_length=1, max_length=1024)]
    size_bytes: Count
    shared: bool = False
    # Where the agent fetched it from, exactly as the profile's model_path names
    # it (an https:// URL or hf://org/name[/path][@revision]); "" for weights that were
    # already there. Only complete, verified fetches are reported.
    source: Annotated[str, Field(max_length=1024)] = ""
    # When an engine last used it (unix seconds, the agent's clock). None: never
    # seen in use by this agent.
    last_used: Annotated[float, Field(ge=0)] | None = None


class EngineInstall(_Part):
    engine: Annotated[str, Field(min_length=1, max_length=32)]
    version: ShortStr = ""
    variant: ShortStr = ""
    # installing, installed, failed or unsupported (docs/engines.md); free text, so a
    # newer agent's state is shown rather than refused.
    state: Annotated[str, Field(max_length=32)]
    detail: Text = ""
    # While installing, where known (a download's share). None: not known.
    progress_percent: Annotated[int, Field(ge=0, le=100)] | None = None


class RunningShard(_Part):
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


class ShardLoad(_Part):
    shard_id: ShardId
    cpu_cores: Annotated[float, Field(ge=0)]
    rss_bytes: Count
    # GPU memory the group's processes hold on the GPU where they hold the most
    # (NVML, per process). None: not measured (no GPU process of this group seen).
    gpu_memory_mb: SmallCount | None = None


class Load(_Part):
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
        return _unique(v, "shard_id", "shard")


class GPUProblem(_Part):
    """A problem found after registration. Without an index it is charged to GPU 0."""

    gpu_index: GpuIndex | None = None
    problem: ShortStr


# ---- agent -> control plane --------------------------------------------------


class Register(_Msg):
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
        return _unique(v, "index", "GPU index")

    @field_validator("provision")
    @classmethod
    def _one_install_per_engine(cls, v):
        return _unique(v, "engine", "engine")

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


class Heartbeat(_Msg):
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
        return _unique(v, "engine", "engine")


class AdapterStatus(_Part):
    """A LoRA adapter as a shard's engine holds it: loading, loaded, or failed and why."""

    name: ShortStr
    # Free text, like a shard's state: a newer agent's state is shown, not refused.
    state: Annotated[str, Field(min_length=1, max_length=16)]
    error: Text = ""
    # The engine's own number for it, where requests name it so (llama.cpp's "lora" id).
    id: SmallCount | None = None


class ShardStatus(_Msg):
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


class FetchProgress(_Msg):
    """Progress of a weight fetch. Not a state transition: it must not reset start timers."""

    type: Literal["fetch_progress"]
    shard_id: ShardId
    replica_id: ShortStr = ""
    source: Annotated[str, Field(max_length=1024)] = ""
    bytes_done: Count
    bytes_total: Count | None = None


class LogsReply(_Msg):
    type: Literal["logs_reply"]
    request_id: Annotated[str, Field(min_length=1, max_length=64)]
    lines: Annotated[list[Text], Field(max_length=10000)] = []
    sources: Annotated[list[ShortStr], Field(max_length=256)] = []
    error: Text = ""


class AgentAck(_Msg):
    """The agent acknowledges a control-plane message, e.g. a desired set it has applied."""

    type: Literal["ack"]
    of: Literal["desired", "provision", "remove_weights"]
    version: Version = 0
    ok: bool = True
    detail: Text = ""
    # remove_weights only: the proposal's request_id, and per path what happened.
    request_id: Annotated[str, Field(max_length=64)] = ""
    removed: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=1024)] = []
    kept: Annotated[list[KeptWeights], Field(max_length=1024)] = []


class GPUEventReport(_Part):
    """One critical event as the driver delivered it (``agentd.xid`` names the kinds)."""

    gpu_index: GpuIndex
    # "xid", "double_bit_ecc", "clock", or the driver's event type in hex: free text, so
    # a newer agent's kind is counted, not refused (one not known is watched only).
    kind: Annotated[str, Field(min_length=1, max_length=32)]
    xid: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None


class GPUSlowdown(_Part):
    """A GPU's harmful clock slowdowns now ("HW Thermal Slowdown"); empty: none."""

    gpu_index: GpuIndex
    reasons: Annotated[list[ShortStr], Field(max_length=16)] = []


class GPUEvents(_Msg):
    """Critical GPU events (XIDs, double-bit ECC), sent the moment the driver delivers
    them rather than with the next heartbeat, and the GPUs whose harmful slowdowns
    changed. The control plane decides what they mean (docs/operations.md)."""

    type: Literal["gpu_events"]
    events: Annotated[list[GPUEventReport], Field(max_length=256)] = []
    slowdowns: Annotated[list[GPUSlowdown], Field(max_length=64)] = []

    @field_validator("slowdowns")
    @classmethod
    def _one_per_gpu(cls, v):
        return _unique(v, "gpu_index", "GPU index")


# A notice further off than a week is not a notice.
NOTICE_MAX_S = 7 * 86400


class NodeNotice(_Msg):
    """The node is going away in ``in_s`` seconds (as of sending): its cloud's metadata
    or a file said so. ``in_s`` rather than a time, so the clocks need not agree."""

    type: Literal["node_notice"]
    in_s: Annotated[float, Field(ge=0, le=NOTICE_MAX_S)]
    source: Annotated[str, Field(min_length=1, max_length=64)]
    reason: ShortStr = ""


class Goodbye(_Msg):
    """Sent before an orderly shutdown (SIGTERM): the node is leaving on purpose."""

    type: Literal["goodbye"]
    reason: Text = ""


AgentMessage = Annotated[
    Register
    | Heartbeat
    | ShardStatus
    | FetchProgress
    | LogsReply
    | AgentAck
    | GPUEvents
    | NodeNotice
    | Goodbye,
    Field(discriminator="type"),
]

# ---- control plane -> agent --------------------------------------------------


class ProfileSpec(_Part):
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


class AdapterSpec(_Part):
    """A LoRA adapter a shard's engine should hold: fetched like weights, then loaded."""

    name: ShortStr
    # As a profile's model_path: a local path, an https:// URL, or hf://org/name[...].
    source: Annotated[str, Field(min_length=1, max_length=1024)]
    sha256: Annotated[
        dict[Annotated[str, Field(max_length=1024)], Sha256Hex], Field(max_length=256)
    ] = {}


class DesiredShard(_Part):
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


class ServerAck(_Msg):
    """Answers a register. On enrolment it carries the node's new credential, once."""

    type: Literal["ack"]
    of: Literal["register", "heartbeat"]
    node_id: NodeId
    seq: Count = 0
    credential: str | None = None
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 10


class Desired(_Msg):
    """The full set of shards this node should have. Newer versions replace older ones."""

    type: Literal["desired"]
    version: Count
    shards: Annotated[list[DesiredShard], Field(max_length=256)] = []


class EngineWant(_Part):
    engine: Annotated[str, Field(min_length=1, max_length=32)]
    version: ShortStr = ""
    variant: ShortStr = ""


class Provision(_Msg):
    type: Literal["provision"]
    engines: Annotated[list[EngineWant], Field(max_length=32)] = []


class RemoveWeights(_Msg):
    """A proposal: the node checks each path again before removing it.

    ``desired_version`` is the node's desired-set version the proposal was made
    against: an agent that has not applied that version yet keeps everything,
    and a path a desired shard (started or not) needs is always kept.
    """

    type: Literal["remove_weights"]
    paths: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=1024)]
    desired_version: Version = 0
    # Echoed in the agent's ack, so the control plane can match the reply.
    request_id: Annotated[str, Field(max_length=64)] = ""


class LogsRequest(_Msg):
    type: Literal["logs_request"]
    request_id: Annotated[str, Field(min_length=1, max_length=64)]
    # "agent" for the agent's own log, or a shard id for that engine's output.
    source: ShortStr = "agent"
    lines: Annotated[int, Field(ge=1, le=10000)] = 200


class Closing(_Msg):
    """Sent just before the control plane closes the socket: the close code, and why.

    The close frame carries the same code, but Daphne drops a close frame's
    reason (django/daphne#374), so this message is how the reason reaches the
    agent's log. An agent that does not know it can ignore it.
    """

    type: Literal["closing"]
    code: Annotated[int, Field(ge=1000, le=4999)]
    reason: Text = ""


ControlMessage = Annotated[
    ServerAck | Desired | Provision | RemoveWeights | LogsRequest | Closing,
    Field(discriminator="type"),
]

_agent_adapter: TypeAdapter = TypeAdapter(AgentMessage)
_control_adapter: TypeAdapter = TypeAdapter(ControlMessage)


AGENT_TYPES = {
    "register",
    "heartbeat",
    "shard_status",
    "fetch_progress",
    "logs_reply",
    "ack",
    "gpu_events",
    "node_notice",
    "goodbye",
}
CONTROL_TYPES = {"ack", "desired", "provision", "remove_weights", "logs_request", "closing"}


def parse_agent_message(raw: str | bytes | dict):
    """Validate a message from an agent, or raise ProtocolError."""
    return decode(raw, _agent_adapter, AGENT_TYPES)


def parse_control_message(raw: str | bytes | dict):
    """Validate a message from the control plane, or raise ProtocolError."""
    return decode(raw, _control_adapter, CONTROL_TYPES)


def dump(msg: BaseModel) -> str:
    """A message as the JSON text that goes on the wire."""
    return msg.model_dump_json()
