"""One node as a line of the console's tables: its bars, GPUs, engines and disks.

Unknown is not zero: a bar whose figure the node never sent (or sent more
than a minute ago) has no width and reads "-".
"""

from dataclasses import dataclass
from datetime import datetime

from fleet.models import GPU, GPUHealth, Node, ShardState

from .. import nodes
from ..autoscaler.status import asleep_text
from ..snapshot import asleep_host_mb
from ..units import MIB_PER_GIB
from ..units import bytes_text as human_bytes


@dataclass
class Bar:
    """A figure out of a whole. ``percent`` None: unknown, drawn empty and read "-"."""

    percent: float | None
    text: str

    @property
    def width(self) -> str:
        """The CSS width, clamped; never a value from a peer unclamped."""
        if self.percent is None:
            return "0"
        return f"{max(0.0, min(100.0, self.percent)):.1f}"

    @property
    def level(self) -> str:
        if self.percent is None:
            return "unknown"
        return "high" if self.percent >= 90 else "mid" if self.percent >= 70 else "low"


def cpu_bar(load) -> Bar:
    if load is None:
        return Bar(None, "-")
    return Bar(load.cpu_percent, f"{load.cpu_percent:.0f}% of {load.cpu_count}")


def ram_bar(node: Node, load) -> Bar:
    """Used of total. '-' when the node never said its memory, or its sample is stale."""
    if load is None or not node.memory_total_mb:
        return Bar(None, "-")
    total = node.memory_total_mb * 2**20
    used = load.memory_used_bytes
    return Bar(100.0 * used / total, f"{human_bytes(used)} / {human_bytes(total)}")


def gpu_bar(gpu: GPU) -> Bar:
    if not gpu.memory_total_mb:
        return Bar(None, "-")
    return Bar(
        100.0 * gpu.memory_used_mb / gpu.memory_total_mb,
        f"{gpu.memory_used_mb / 1024:.0f} / {gpu.memory_total_mb / 1024:.0f} GiB",
    )


def xids_text(xids: dict | None) -> str:
    """'79×1, 94×2': how many of each XID a GPU reported, by number; '' for none."""
    counts = sorted((int(k), v) for k, v in (xids or {}).items() if str(k).isdigit())
    return ", ".join(f"{k}×{v}" for k, v in counts)


@dataclass
class GPULine:
    index: int
    name: str
    bar: Bar
    problems: list
    temperature_c: int | None
    # The node page: the shards on it, and what shares of it are promised.
    use: str = ""
    # docs/operations.md, "GPU faults and notices": healthy, degraded or failed, and why.
    health: str = "healthy"
    health_reason: str = ""
    xids: str = ""  # xids_text
    # A fault (or a drain for one) an operator may clear.
    clearable: bool = False


@dataclass
class EngineLine:
    engine: str
    version: str
    state: str  # an install state from the agent, or "reported" for engine_versions only
    detail: str = ""
    variant: str = ""  # the build installed or tried: cu13, cu129, cpu, cuda


FETCHING = ("pending", "starting")


def fetch_progress_text(done: int | None, total: int | None) -> str:
    """'3.0 GiB of 15.0 GiB (20%)', '3.0 GiB' when the total is unknown, '-' before any."""
    if done is None:
        return "-"
    if not total:
        return human_bytes(done)
    return f"{human_bytes(done)} of {human_bytes(total)} ({100 * done / total:.0f}%)"


def fetch_text(shard) -> str:
    """What a shard fetching its weights shows: source and progress; '' when not fetching.

    Progress is kept after the fetch (the admin shows it); the pages show it only
    while the shard has not started loading, which is when it means something.
    """
    if shard.state not in FETCHING or shard.fetch_bytes_done is None:
        return ""
    progress = fetch_progress_text(shard.fetch_bytes_done, shard.fetch_bytes_total)
    return f"{shard.fetch_source}: {progress}" if shard.fetch_source else progress


@dataclass
class NodeLine:
    id: str
    hostname: str
    state: str
    state_text: str
    connected: bool
    cordoned: bool
    draining: bool
    cpu: Bar
    ram: Bar
    gpus: list[GPULine]
    engines: list[EngineLine]
    shards_ready: int
    shards_all: int
    last_seen: datetime | None
    agent_version: str
    fetch: str = ""  # the shards fetching weights there, summed
    vllm_build: str = "auto"  # the operators' choice (auto, cu13, cu129, cpu, none)
    shards_asleep: int = 0  # of shards_all: their engines sleep (docs/operations.md)
    notice_deadline: datetime | None = None  # it goes away then (a notice)


def _engines(node: Node) -> list[EngineLine]:
    installs = {i.engine: i for i in node.engine_installs.all()}
    out = [
        EngineLine(i.engine, i.version, i.state, i.detail, i.variant)
        for _, i in sorted(installs.items())
    ]
    for engine, version in sorted((node.engine_versions or {}).items()):
        if engine not in installs:
            out.append(EngineLine(str(engine), str(version), "reported"))
    return out


def _gpu_lines(gpus) -> list[GPULine]:
    return [
        GPULine(
            g.index,
            g.name,
            gpu_bar(g),
            list(g.problems),
            g.temperature_c,
            health=g.health,
            health_reason=g.health_reason,
            xids=xids_text(g.xids),
            clearable=g.fault != GPUHealth.HEALTHY or g.drained_at is not None,
        )
        for g in gpus
    ]


def node_line(node: Node, now: datetime) -> NodeLine:
    load = nodes.fresh_load(node, now)
    return NodeLine(
        id=node.pk,
        hostname=node.hostname,
        state=node.state,
        state_text=nodes.state_display(node),
        connected=node.connected,
        cordoned=node.cordoned,
        draining=node.draining,
        cpu=cpu_bar(load),
        ram=ram_bar(node, load),
        gpus=_gpu_lines(node.gpus.all()),
        engines=_engines(node),
        shards_ready=getattr(node, "ready_count", 0),
        shards_all=getattr(node, "shard_count", 0),
        last_seen=node.last_seen,
        agent_version=node.agent_version,
        fetch=_node_fetch(node),
        vllm_build=node.vllm_build,
        shards_asleep=getattr(node, "asleep_count", 0),
        notice_deadline=node.notice_deadline,
    )


def _node_fetch(node: Node) -> str:
    """'2 shards: 3.0 GiB of 12.0 GiB (25%)' from node_queryset's sums; '' when none fetch."""
    count = getattr(node, "fetch_count", 0)
    if not count:
        return ""
    total = None if getattr(node, "fetch_unknown", 0) else node.fetch_total
    progress = fetch_progress_text(node.fetch_done, total)
    return f"{count} shard{'s' if count != 1 else ''}: {progress}"


@dataclass
class DiskLine:
    path: str
    bar: Bar  # used of total
    free: str
    total: str
    shared: bool


def disk_line(s) -> DiskLine:
    used = s.total_bytes - s.free_bytes
    bar = (
        Bar(100.0 * used / s.total_bytes, f"{human_bytes(used)} used")
        if s.total_bytes
        else Bar(None, "-")
    )
    return DiskLine(s.path, bar, human_bytes(s.free_bytes), human_bytes(s.total_bytes), s.shared)


def gpu_use(gpus, holders_of) -> dict[int, str]:
    """Per GPU index, the shards on it: "qwen-72b (whole)", or the shares of it with
    their budgets and what is promised of the GPU's total (placement's count); a shard
    asleep holds none of it ("qwen-7b asleep") and is not counted in what is promised.

    ``holders_of``: (model, its profile's gpu_memory_gb, the shard's GPU UUIDs, whether
    it is asleep) for each shard on the node that is not finished, by model name."""
    by_uuid = {g.uuid: g for g in gpus}
    holders: dict[int, list[str]] = {}
    promised: dict[int, float] = {}
    for model, budget, uuids, asleep in sorted(holders_of, key=lambda h: h[0]):
        for uuid in uuids or ():
            g = by_uuid.get(uuid)
            if g is None:
                continue
            if asleep:
                holders.setdefault(g.index, []).append(f"{model} asleep")
                continue
            holders.setdefault(g.index, []).append(
                f"{model} {budget:g} GB" if budget else f"{model} (whole)"
            )
            if budget:
                promised[g.index] = promised.get(g.index, 0) + budget
    out = {}
    for g in gpus:
        if g.index not in holders:
            continue
        text = ", ".join(holders[g.index])
        if g.index in promised:
            total = g.memory_total_mb / MIB_PER_GIB
            text += f"; {promised[g.index]:.1f} of {total:.1f} GB promised"
        out[g.index] = text
    return out


def asleep_host_text(profile, shards, since: datetime | None, now: datetime) -> str:
    """A sleeping replica, or one shard of it, as the pages say it (``asleep_text``): how
    long since ``since`` and the host memory its shards asleep hold (``asleep_host_mb``);
    "going to sleep" while none is asleep on its node yet."""
    sleeping = [s for s in shards if s.state == ShardState.ASLEEP]
    if not sleeping:
        return asleep_text(since, None, now)
    host_mb = sum(asleep_host_mb(profile, s.spec or {}, bool(s.gpu_uuids)) for s in sleeping)
    return asleep_text(since, host_mb, now)
