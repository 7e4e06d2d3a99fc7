"""What the operator's console shows: the cluster, one node, one model, as plain data.

The pages (``fleet/console/``) only lay these out. Each function reads in a
fixed number of queries whatever the fleet's size: the cluster page is a
page of nodes plus a handful of totals, each one aggregate query (the test
in tests/console/ counts them at 10 and at 100 nodes).

Unknown is not zero: a bar whose figure the node never sent (or sent more
than a minute ago) has no width and reads "-".
"""

from dataclasses import dataclass, field
from datetime import datetime

import redis
from django.core.paginator import Paginator
from django.db.models import Count, Prefetch, Q
from django.utils import timezone

from fleet.conf import fleet_settings
from fleet.models import (
    GPU,
    SHARD_FINISHED,
    EngineInstall,
    Model,
    Node,
    NodeState,
    Replica,
    ReplicaState,
    Shard,
    ShardLoad,
    ShardState,
)

from . import history, nodes, prometheus
from .reconciler.expiry import fleet_warnings
from .units import bytes_text as human_bytes

PAGE_SIZE = 100
# Pending replicas listed on the cluster page; the total is always given.
PENDING_SHOWN = 50
# What the state filter of the node table offers.
STATE_FILTERS = ("ready", "suspect", "lost", "cordoned", "draining", "disconnected")


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


@dataclass
class GPULine:
    index: int
    name: str
    bar: Bar
    problems: list
    temperature_c: int | None


@dataclass
class EngineLine:
    engine: str
    version: str
    state: str  # an install state from the agent, or "reported" for engine_versions only
    detail: str = ""


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


def _engines(node: Node) -> list[EngineLine]:
    installs = {i.engine: i for i in node.engine_installs.all()}
    out = [EngineLine(i.engine, i.version, i.state, i.detail) for _, i in sorted(installs.items())]
    for engine, version in sorted((node.engine_versions or {}).items()):
        if engine not in installs:
            out.append(EngineLine(str(engine), str(version), "reported"))
    return out


def _gpu_lines(gpus) -> list[GPULine]:
    return [GPULine(g.index, g.name, gpu_bar(g), list(g.problems), g.temperature_c) for g in gpus]


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
    )


@dataclass
class Totals:
    nodes: int
    nodes_by_state: dict[str, int]
    connected: int
    cordoned: int
    draining: int
    gpus: int
    gpus_used: int
    gpus_free: int
    gpus_with_problems: int
    replicas_by_state: dict[str, int]


@dataclass
class PendingLine:
    id: str
    model: str
    model_id: int
    reason: str
    since: datetime | None


@dataclass
class ModelLine:
    id: int
    name: str
    desired: int
    ready: int
    pending: int
    failed: int


# Models listed on the cluster page, by name; a catalog larger than this is in the admin.
MODELS_SHOWN = 200


def model_lines() -> list[ModelLine]:
    """Each model with its replicas ready, pending and failed: one query."""
    rows = Model.objects.annotate(
        ready=Count("replicas", filter=Q(replicas__state=ReplicaState.READY)),
        pending=Count("replicas", filter=Q(replicas__state=ReplicaState.PENDING)),
        failed=Count("replicas", filter=Q(replicas__state=ReplicaState.FAILED)),
    ).order_by("name")[:MODELS_SHOWN]
    return [ModelLine(m.pk, m.name, m.desired_replicas, m.ready, m.pending, m.failed) for m in rows]


@dataclass
class Cluster:
    totals: Totals
    warnings: list[str]
    nodes: list[NodeLine]
    page: int
    pages: int
    count: int
    query: str
    state: str
    pending: list[PendingLine]
    pending_total: int
    models: list[ModelLine] = field(default_factory=list)
    at: datetime = field(default_factory=timezone.now)


def _node_filter(q: str, state: str) -> Q:
    where = Q()
    if q:
        where &= Q(id__icontains=q) | Q(hostname__icontains=q)
    if state in (NodeState.READY, NodeState.SUSPECT, NodeState.LOST):
        where &= Q(state=state)
    elif state == "cordoned":
        where &= Q(cordoned=True)
    elif state == "draining":
        where &= Q(draining=True)
    elif state == "disconnected":
        where &= Q(connected=False)
    return where


def node_queryset(where: Q | None = None):
    """Nodes with everything a node line shows, in three queries for any number of them."""
    return (
        Node.objects.filter(where or Q())
        .select_related("load")
        .prefetch_related(
            Prefetch("gpus", queryset=GPU.objects.order_by("index")),
            Prefetch("engine_installs", queryset=EngineInstall.objects.order_by("engine")),
        )
        .annotate(
            shard_count=Count("shards", filter=~Q(shards__state__in=SHARD_FINISHED), distinct=True),
            ready_count=Count("shards", filter=Q(shards__state=ShardState.READY), distinct=True),
        )
        .order_by("id")
    )


def totals() -> Totals:
    """Fleet-wide counts, four aggregate queries."""
    n = Node.objects.aggregate(
        total=Count("id"),
        connected=Count("id", filter=Q(connected=True)),
        cordoned=Count("id", filter=Q(cordoned=True)),
        draining=Count("id", filter=Q(draining=True)),
        **{s: Count("id", filter=Q(state=s)) for s in NodeState.values},
    )
    g = GPU.objects.aggregate(total=Count("id"), sick=Count("id", filter=~Q(problems=[])))
    # A GPU is used while a shard that is not finished holds it.
    used = set()
    for uuids in (
        Shard.objects.exclude(state__in=SHARD_FINISHED)
        .exclude(node=None)
        .values_list("gpu_uuids", flat=True)
    ):
        used.update(str(u) for u in uuids or ())
    by_state = dict(
        Replica.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n")
    )
    return Totals(
        nodes=n["total"],
        nodes_by_state={s: n[s] for s in NodeState.values},
        connected=n["connected"],
        cordoned=n["cordoned"],
        draining=n["draining"],
        gpus=g["total"],
        gpus_used=len(used),
        gpus_free=max(0, g["total"] - len(used) - g["sick"]),
        gpus_with_problems=g["sick"],
        replicas_by_state={s: by_state.get(s, 0) for s in ReplicaState.values},
    )


def cluster(page: int = 1, q: str = "", state: str = "", now: datetime | None = None) -> Cluster:
    """The cluster page: totals, warnings, one page of nodes, pending replicas."""
    now = now or timezone.now()
    q = q.strip()[:100]
    state = state if state in STATE_FILTERS else ""
    paginator = Paginator(node_queryset(_node_filter(q, state)), PAGE_SIZE)
    current = paginator.get_page(page)
    t = totals()
    pending = [
        PendingLine(r.pk, r.model.name, r.model_id, r.reason, r.state_changed_at or r.created_at)
        for r in Replica.objects.filter(state=ReplicaState.PENDING)
        .select_related("model")
        .order_by("created_at")[:PENDING_SHOWN]
    ]
    return Cluster(
        totals=t,
        warnings=fleet_warnings(now),
        nodes=[node_line(n, now) for n in current.object_list],
        page=current.number,
        pages=paginator.num_pages,
        count=paginator.count,
        query=q,
        state=state,
        pending=pending,
        pending_total=t.replicas_by_state.get(ReplicaState.PENDING, 0),
        models=model_lines(),
        at=now,
    )


# ---- one node ---------------------------------------------------------------------------


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


def node_detail(node_id: str, now: datetime | None = None) -> NodeDetail:
    """Everything the node page shows but its charts and logs. Raises nodes.NodeNotFound."""
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
    for s in shards:
        sl = shard_loads.get(s.pk)
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
            )
        )
    live = [s for s in lines if s.state not in SHARD_FINISHED]
    return NodeDetail(
        node=node,
        line=node_line(node, now),
        load=load,
        memory_total=nodes.memory_gb(node),
        labels=sorted((str(k), str(v)) for k, v in node.labels.items()),
        storage=[disk_line(s) for s in node.storage.all()],
        shards=lines,
        models=sorted({s.model for s in live}),
        desired=nodes.desired_sync(node, now),
        log_sources=[("agent", "the agent")] + [(s.id, f"{s.model} (shard {s.id})") for s in live],
    )


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


# ---- one model --------------------------------------------------------------------------


@dataclass
class ReplicaLine:
    id: str
    state: str
    reason: str
    restarts: int
    profile: str
    shards: list  # Shard rows with node


@dataclass
class GatewayFigures:
    source: str  # "prometheus", "history" or "" (none)
    requests_per_s: float | None = None
    latency_s: float | None = None
    p95_latency_s: float | None = None
    queue: float | None = None
    error: str = ""


@dataclass
class ModelDetail:
    model: Model
    replicas: list[ReplicaLine]
    by_state: dict[str, int]
    gateway: GatewayFigures


# The window the model page's rates are taken over.
RATE_WINDOW_S = 300


def gateway_figures(name: str, now: float) -> GatewayFigures:
    """Requests a second and latency through the gateway over the last five minutes."""
    if fleet_settings().prometheus_url:
        out = GatewayFigures("prometheus")
        m = prometheus.quote(name)
        w = f"{RATE_WINDOW_S}s"
        queries = {
            "requests_per_s": f"sum(rate(llmgw_gateway_requests_total{{model={m}}}[{w}]))",
            "latency_s": f"sum(rate(llmgw_gateway_request_duration_seconds_sum{{model={m}}}[{w}]))"
            f" / sum(rate(llmgw_gateway_request_duration_seconds_count{{model={m}}}[{w}]))",
            "p95_latency_s": "histogram_quantile(0.95, sum by (le) "
            f"(rate(llmgw_gateway_request_duration_seconds_bucket{{model={m}}}[{w}])))",
            "queue": f"sum(llmgw_gateway_queue_depth{{model={m}}})",
        }
        try:
            for attr, query in queries.items():
                result = prometheus.query_range(query, now - 60, now, 60)
                points = result[0][1] if result else []
                setattr(out, attr, points[-1][1] if points else None)
        except prometheus.PrometheusError as exc:
            out.error = str(exc)
        return out
    out = GatewayFigures("history")
    try:
        out.requests_per_s, out.latency_s = history.gateway_rates(name, now - RATE_WINDOW_S)
        queue = history.queue_points(name, now - RATE_WINDOW_S)
        out.queue = queue[-1][1] if queue else None
    except redis.RedisError as exc:
        out.error = f"the history in Redis could not be read: {exc}"
    return out


def model_detail(pk: int, now: datetime | None = None) -> ModelDetail:
    """A model's replicas, where they run and why any wait; raises Model.DoesNotExist."""
    now = now or timezone.now()
    model = Model.objects.select_related("active_profile").get(pk=pk)
    replicas = (
        Replica.objects.filter(model=model)
        .select_related("profile")
        .prefetch_related(
            Prefetch("shards", queryset=Shard.objects.select_related("node").order_by("rank"))
        )
        .order_by("created_at")
    )
    lines = [
        ReplicaLine(r.pk, r.state, r.reason, r.restarts, r.profile.name, list(r.shards.all()))
        for r in replicas
    ]
    by_state = {s: 0 for s in ReplicaState.values}
    for r in lines:
        by_state[r.state] = by_state.get(r.state, 0) + 1
    return ModelDetail(model, lines, by_state, gateway_figures(model.name, now.timestamp()))
