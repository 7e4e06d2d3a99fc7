"""The cluster page: totals, one page of nodes, the models, pending and asleep replicas.

A page of nodes plus a handful of totals, each one aggregate query: the same
number of queries whatever the fleet's size (tests/console/ counts them at 10
and at 100 nodes).
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.core.paginator import Paginator
from django.db.models import Count, Prefetch, Q, Sum
from django.utils import timezone

from fleet.models import (
    GPU,
    SHARD_FINISHED,
    EngineInstall,
    GPUHealth,
    Model,
    Node,
    NodeState,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
    Team,
)

from ..autoscaler.status import scaling_status
from ..reconciler.expiry import fleet_warnings
from .lines import FETCHING, NodeLine, asleep_host_text, gpu_use, node_line

PAGE_SIZE = 100
# Pending and asleep replicas listed on the cluster page; the totals are always given.
PENDING_SHOWN = 50
ASLEEP_SHOWN = 50
# What the state filter of the node table offers.
STATE_FILTERS = ("ready", "suspect", "lost", "cordoned", "draining", "disconnected")


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
    # healthy, degraded, failed -> how many (docs/operations.md, "GPU faults and notices").
    gpus_by_health: dict[str, int] = field(default_factory=dict)


@dataclass
class PendingLine:
    id: str
    model: str
    model_id: int
    reason: str
    since: datetime | None


@dataclass
class AsleepLine:
    """A replica whose engines sleep (docs/operations.md, "Sleep and wake")."""

    id: str
    model: str
    model_id: int
    nodes: list[str]
    text: str  # "asleep 4 minutes · holds 16 GB of host memory" (lines.asleep_host_text)


@dataclass
class ModelLine:
    id: int
    name: str
    desired: int
    ready: int
    pending: int
    failed: int
    scaling: str = ""  # autoscaler.status.scaling_status: "" without autoscaling
    asleep: int = 0


@dataclass
class TeamLine:
    """One team's use against its quotas; a quota of None is no bound."""

    name: str
    members: int
    models: int
    gpus: int
    max_gpus: int | None
    gpu_memory_gb: float
    max_gpu_memory_gb: int | None
    replicas: int
    max_replicas: int | None
    tokens: int
    tokens_per_month: int | None


def team_lines() -> list[TeamLine]:
    """Each team with what it holds now and its tokens this month: a query when there are
    no teams, four when there are (``teams.in_use``)."""
    from ..teams import NOTHING_IN_USE, in_use

    rows = list(
        Team.objects.annotate(
            n_models=Count("models", distinct=True),
            n_members=Count("group__user", distinct=True),
        ).order_by("name")
    )
    if not rows:
        return []
    use = in_use(rows)
    lines = []
    for t in rows:
        u = use.get(t.pk, NOTHING_IN_USE)
        lines.append(
            TeamLine(
                t.name,
                t.n_members,
                t.n_models,
                u["gpus"],
                t.max_gpus,
                u["gpu_memory_gb"],
                t.max_gpu_memory_gb,
                u["replicas"],
                t.max_replicas,
                u["tokens_this_month"],
                t.tokens_per_month,
            )
        )
    return lines


# Models listed on the cluster page, by name; a catalog larger than this is in the admin.
MODELS_SHOWN = 200


def model_lines() -> list[ModelLine]:
    """Each model with its replicas ready, pending, failed and asleep, and its scaling: one
    query."""
    rows = Model.objects.annotate(
        ready=Count("replicas", filter=Q(replicas__state=ReplicaState.READY)),
        pending=Count("replicas", filter=Q(replicas__state=ReplicaState.PENDING)),
        failed=Count("replicas", filter=Q(replicas__state=ReplicaState.FAILED)),
        asleep=Count("replicas", filter=Q(replicas__state=ReplicaState.ASLEEP)),
    ).order_by("name")[:MODELS_SHOWN]
    return [
        ModelLine(
            m.pk,
            m.name,
            m.desired_replicas,
            m.ready,
            m.pending,
            m.failed,
            scaling=scaling_status(m, m.ready),
            asleep=m.asleep,
        )
        for m in rows
    ]


def asleep_lines(now: datetime) -> list[AsleepLine]:
    """The replicas asleep, longest asleep first, with where they sleep and what they
    hold: two queries."""
    rows = (
        Replica.objects.filter(state=ReplicaState.ASLEEP)
        .select_related("model", "profile")
        .prefetch_related(Prefetch("shards", queryset=Shard.objects.order_by("rank")))
        .order_by("state_changed_at", "created_at")[:ASLEEP_SHOWN]
    )
    lines = []
    for r in rows:
        shards = list(r.shards.all())
        lines.append(
            AsleepLine(
                r.pk,
                r.model.name,
                r.model_id,
                [s.node_id for s in shards if s.node_id],
                asleep_host_text(r.profile, shards, r.state_changed_at, now),
            )
        )
    return lines


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
    asleep: list[AsleepLine] = field(default_factory=list)
    asleep_total: int = 0
    teams: list[TeamLine] = field(default_factory=list)
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


_FETCHING = Q(shards__state__in=FETCHING, shards__fetch_bytes_done__isnull=False)


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
            asleep_count=Count("shards", filter=Q(shards__state=ShardState.ASLEEP), distinct=True),
            # Shards fetching weights there, summed: no query of its own (node lines).
            fetch_count=Count("shards", filter=_FETCHING, distinct=True),
            fetch_unknown=Count(
                "shards", filter=_FETCHING & Q(shards__fetch_bytes_total__isnull=True)
            ),
            fetch_done=Sum("shards__fetch_bytes_done", filter=_FETCHING),
            fetch_total=Sum("shards__fetch_bytes_total", filter=_FETCHING),
        )
        .order_by("id")
    )


def _holders() -> dict[str, list[tuple]]:
    """By node, (model, gpu_memory_gb, GPU UUIDs, asleep) of each shard that is not
    finished (``lines.gpu_use``)."""
    held: dict[str, list[tuple]] = {}
    for node_id, uuids, model, budget, state in (
        Shard.objects.exclude(state__in=SHARD_FINISHED)
        .exclude(node=None)
        .values_list(
            "node_id",
            "gpu_uuids",
            "replica__model__name",
            "replica__profile__gpu_memory_gb",
            "state",
        )
    ):
        held.setdefault(node_id, []).append((model, budget, uuids, state == ShardState.ASLEEP))
    return held


def totals(holders: dict[str, list[tuple]] | None = None) -> Totals:
    """Fleet-wide counts, four aggregate queries (three given ``_holders()``)."""
    n = Node.objects.aggregate(
        total=Count("id"),
        connected=Count("id", filter=Q(connected=True)),
        cordoned=Count("id", filter=Q(cordoned=True)),
        draining=Count("id", filter=Q(draining=True)),
        **{s: Count("id", filter=Q(state=s)) for s in NodeState.values},
    )
    # Not free: a problem, or health other than healthy (placement takes neither).
    g = GPU.objects.aggregate(
        total=Count("id"),
        sick=Count("id", filter=~Q(problems=[]) | ~Q(health=GPUHealth.HEALTHY)),
        **{h: Count("id", filter=Q(health=h)) for h in GPUHealth.values},
    )
    # A GPU is used while a shard that is not finished holds it, whole or a share of it;
    # one asleep gave its GPU memory back (fleet.services.snapshot counts it so too).
    used = set()
    for held in (_holders() if holders is None else holders).values():
        for _, _, uuids, asleep in held:
            if not asleep:
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
        gpus_by_health={h: g[h] for h in GPUHealth.values},
    )


def _with_gpu_use(nodes, lines, holders: dict[str, list[tuple]]):
    """The shards on each GPU of these nodes (``gpu_use``), from ``_holders()``."""
    for node, line in zip(nodes, lines, strict=True):
        use = gpu_use(node.gpus.all(), holders.get(node.pk, ()))
        for g in line.gpus:
            g.use = use.get(g.index, "")
    return lines


def cluster(page: int = 1, q: str = "", state: str = "", now: datetime | None = None) -> Cluster:
    """The cluster page: totals, warnings, one page of nodes, pending replicas."""
    now = now or timezone.now()
    q = q.strip()[:100]
    state = state if state in STATE_FILTERS else ""
    paginator = Paginator(node_queryset(_node_filter(q, state)), PAGE_SIZE)
    current = paginator.get_page(page)
    holders = _holders()
    t = totals(holders)
    pending = [
        PendingLine(r.pk, r.model.name, r.model_id, r.reason, r.state_changed_at or r.created_at)
        for r in Replica.objects.filter(state=ReplicaState.PENDING)
        .select_related("model")
        .order_by("created_at")[:PENDING_SHOWN]
    ]
    page_nodes = list(current.object_list)
    asleep_total = t.replicas_by_state.get(ReplicaState.ASLEEP, 0)
    return Cluster(
        totals=t,
        warnings=fleet_warnings(now),
        nodes=_with_gpu_use(page_nodes, [node_line(n, now) for n in page_nodes], holders),
        page=current.number,
        pages=paginator.num_pages,
        count=paginator.count,
        query=q,
        state=state,
        pending=pending,
        pending_total=t.replicas_by_state.get(ReplicaState.PENDING, 0),
        models=model_lines(),
        asleep=asleep_lines(now) if asleep_total else [],
        asleep_total=asleep_total,
        teams=team_lines(),
        at=now,
    )
