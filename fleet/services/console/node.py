"""One node's page: its figures now, its disks, weights, GPUs (with their health), engines,
shards, its notice of going away and its own events."""

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from fleet.models import (
    SHARD_FINISHED,
    DesiredState,
    Event,
    Node,
    Shard,
    ShardLoad,
    ShardState,
)

from .. import nodes
from ..snapshot import asleep_host_mb
from ..units import bytes_text as human_bytes
from ..units import gb_text, gpu_use_text, over_gpu_budget
from ..weights_gc import inventory as weights_inventory
from .cluster import node_queryset
from .lines import (
    DiskLine,
    NodeLine,
    asleep_host_text,
    disk_line,
    fetch_text,
    gpu_use,
    node_line,
)


@dataclass
class ShardLine:
    id: str
    model: str
    model_id: int
    replica: str
    rank: int
    engine: str
    state: str
    desired_state: str
    port: int | None
    restarts: int
    cores: str
    memory: str
    error: str
    fetch: str = ""  # source and progress while its weights are fetched
    gpu_memory: str = "-"  # used of its budget ("28.1 of 30 GB")
    over_gpu_budget: bool = False
    # Asleep, or told to sleep: "asleep 4 minutes · holds 16 GB of host memory".
    asleep: str = ""


@dataclass
class WeightsLine:
    """One weights entry on the node, as the admin's Local weights and ``manage.py weights``
    show it (``weights_gc.inventory``: what uses it is computed from the shards)."""

    path: str
    size: str
    source: str
    last_used: str  # "in use now", a local time, or "-"
    pinned: bool
    in_use_by: list[str]  # "model (shard id)"
    shared: bool
    removal: str  # "proposed", "sent" or "" (none under way)
    kept_reason: str


def weights_lines(node_id: str) -> list[WeightsLine]:
    """The node's weights entries by path, with what uses each: two queries."""
    return [
        WeightsLine(
            path=i.row.path,
            size=human_bytes(i.row.size_bytes),
            source=i.row.source,
            last_used=i.last_used_text,
            pinned=i.row.pinned,
            in_use_by=list(i.used_by),
            shared=i.row.shared,
            removal=i.row.removal,
            kept_reason=i.row.kept_reason,
        )
        for i in weights_inventory.listing(node_id)
    ]


# A node's own events (GPU health, notices) shown on its page, newest first.
EVENTS_SHOWN = 20


@dataclass
class EventLine:
    at: datetime
    kind: str
    text: str


def event_lines(node_id: str) -> list[EventLine]:
    """The node's latest events (``Event.node_id``): one query."""
    rows = Event.objects.filter(node_id=node_id).order_by("-created_at", "-id")[:EVENTS_SHOWN]
    return [EventLine(e.created_at, e.kind, e.reason) for e in rows]


@dataclass
class NodeDetail:
    node: Node
    line: NodeLine
    load: object  # NodeLoad or None
    memory_total: str
    labels: list[tuple[str, str]]
    storage: list[DiskLine]
    shards: list[ShardLine]
    models: list[str]
    desired: str
    log_sources: list[tuple[str, str]]  # (source, what it is)
    weights: list[WeightsLine] | None = None  # None: not asked for (no permission to see them)
    # What its shards asleep hold: "2 shards asleep hold 32 GB of host memory"; "" for none.
    asleep: str = ""
    events: list[EventLine] = field(default_factory=list)


def node_detail(node_id: str, now: datetime | None = None, *, weights: bool = False) -> NodeDetail:
    """Everything the node page shows but its charts and logs, and with ``weights`` its
    weights entries (for those who may view them). Raises nodes.NodeNotFound."""
    now = now or timezone.now()
    node = node_queryset(Q(pk=node_id)).prefetch_related("storage").first()
    if node is None:
        raise nodes.NodeNotFound(f"no node '{node_id}'")
    load = nodes.fresh_load(node, now)
    shards = list(
        Shard.objects.filter(node=node)
        .select_related("replica", "replica__model", "replica__profile")
        .order_by("replica__model__name", "id")
    )
    shard_loads = {
        s.shard_id: s
        for s in ShardLoad.objects.filter(node=node, sampled_at__gte=now - nodes.LOAD_MAX_AGE)
    }
    lines = []
    asleep_count, asleep_mb = 0, 0
    for s in shards:
        sl = shard_loads.get(s.pk)
        gpu_used, budget = sl.gpu_memory_mb if sl else None, s.replica.profile.gpu_memory_gb
        asleep = ""
        if s.state == ShardState.ASLEEP or (
            s.desired_state == DesiredState.ASLEEP and s.state not in SHARD_FINISHED
        ):
            asleep = asleep_host_text(s.replica.profile, [s], s.state_changed_at, now)
        if s.state == ShardState.ASLEEP:
            asleep_count += 1
            asleep_mb += asleep_host_mb(s.replica.profile, s.spec or {}, bool(s.gpu_uuids))
        lines.append(
            ShardLine(
                id=s.pk,
                model=s.replica.model.name,
                model_id=s.replica.model_id,
                replica=s.replica_id,
                rank=s.rank,
                engine=s.replica.profile.engine,
                state=s.state,
                desired_state=s.desired_state,
                port=s.port,
                restarts=s.replica.restarts,
                cores=f"{sl.cpu_cores:.2f}" if sl else "-",
                memory=human_bytes(sl.rss_bytes) if sl else "-",
                error=s.error,
                fetch=fetch_text(s),
                gpu_memory=gpu_use_text(gpu_used, budget) if s.gpu_uuids else "-",
                over_gpu_budget=over_gpu_budget(gpu_used, budget),
                asleep=asleep,
            )
        )
    live = [s for s in lines if s.state not in SHARD_FINISHED]
    line = node_line(node, now)
    use = gpu_use(
        node.gpus.all(),
        [
            (
                s.replica.model.name,
                s.replica.profile.gpu_memory_gb,
                s.gpu_uuids,
                s.state == ShardState.ASLEEP,
            )
            for s in shards
            if s.state not in SHARD_FINISHED
        ],
    )
    for g in line.gpus:
        g.use = use.get(g.index, "")
    return NodeDetail(
        node=node,
        line=line,
        load=load,
        memory_total=nodes.memory_gb(node),
        labels=sorted((str(k), str(v)) for k, v in node.labels.items()),
        storage=[disk_line(s) for s in node.storage.all()],
        shards=lines,
        models=sorted({s.model for s in live}),
        desired=nodes.desired_sync(node, now),
        log_sources=[("agent", "the agent")] + [(s.id, f"{s.model} (shard {s.id})") for s in live],
        weights=weights_lines(node.pk) if weights else None,
        asleep=_asleep_total(asleep_count, asleep_mb),
        events=event_lines(node.pk),
    )


def _asleep_total(count: int, host_mb: int) -> str:
    if not count:
        return ""
    if not host_mb:
        return f"{count} shard{'s' if count != 1 else ''} asleep, holding no host memory"
    noun = "shard asleep holds" if count == 1 else "shards asleep hold"
    return f"{count} {noun} {gb_text(host_mb)} GB of host memory"


def models_on_node(node_id: str) -> list[str]:
    """The models with a shard on the node that is not finished. Raises nodes.NodeNotFound."""
    if not Node.objects.filter(pk=node_id).exists():
        raise nodes.NodeNotFound(f"no node '{node_id}'")
    return sorted(
        set(
            Shard.objects.filter(node_id=node_id)
            .exclude(state__in=SHARD_FINISHED)
            .values_list("replica__model__name", flat=True)
        )
    )
