"""Operator actions on nodes, and the facts operators see about them."""

import logging
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, F, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.utils import timezone

from fleet import audit
from fleet.models import GPU, Node, NodeLoad, ShardLoad, ShardState
from fleet.services import desired
from fleet.services.engines import installs_summary
from fleet.services.reconciler.ask import request_reconcile
from fleet.services.units import gb_text

logger = logging.getLogger(__name__)

# A load sample older than this is left out rather than shown as if current,
# the same rule the metrics follow.
LOAD_MAX_AGE = timedelta(minutes=1)

# Words in GPU names that say who made it rather than what it is.
_GPU_NAME_NOISE = {"nvidia", "tesla", "geforce", "quadro", "amd", "radeon", "instinct", "intel"}


class NodeNotFound(LookupError):
    """No node has this id. The message names it."""


def get_node(node_id: str) -> Node:
    try:
        return Node.objects.get(pk=node_id)
    except Node.DoesNotExist:
        raise NodeNotFound(f"no node '{node_id}'") from None


def cordon(node: Node) -> bool:
    """No new placements on this node. Returns whether anything changed."""
    changed = bool(Node.objects.filter(pk=node.pk, cordoned=False).update(cordoned=True))
    if changed:
        logger.info("node cordoned node=%s", node.pk)
        audit.record(node, {"cordoned": (False, True)})
    return changed


def set_intent(node: Node, **flags: bool) -> bool:
    """Set ``cordoned``/``draining`` as given, in one UPDATE, recording what they were.
    Returns whether anything changed."""
    with transaction.atomic():
        was = Node.objects.select_for_update().filter(pk=node.pk).values(*flags).first() or {}
        changed = bool(Node.objects.filter(pk=node.pk).exclude(**flags).update(**flags))
        if changed:
            audit.record(node, {k: (v, flags[k]) for k, v in was.items()})
    return changed


def uncordon(node: Node) -> bool:
    """Placements allowed again; also ends a drain. Returns whether anything changed."""
    changed = set_intent(node, cordoned=False, draining=False)
    # A notice ends with the uncordon: the node is back, or was never going.
    Node.objects.filter(pk=node.pk, notice_deadline__isnull=False).update(
        notice_deadline=None, notice_source="", notice_reason=""
    )
    if changed:
        logger.info("node uncordoned node=%s", node.pk)
        # Replicas waiting for room may fit now; an update sends no post_save.
        request_reconcile()
    return changed


def desired_sync(node: Node, now: datetime) -> str:
    """How far the node is with its desired set, in words for the admin and pages:
    "v5", "behind: v3 of v5 for 12 s", "not keeping up: v3 of v5 for 45 s"."""
    if node.acked_version >= node.desired_version or node.desired_lag_since is None:
        return f"v{node.acked_version}"
    seconds = desired.lag_s(node.desired_lag_since, now)
    word = "not keeping up" if node_not_keeping_up(node, now) else "behind"
    return f"{word}: v{node.acked_version} of v{node.desired_version} for {seconds:.0f} s"


def node_not_keeping_up(node: Node, now: datetime) -> bool:
    """``desired.not_keeping_up`` for a node row."""
    return desired.not_keeping_up(node.connected, node.desired_lag_since, now)


def with_gpu_use(shards: QuerySet, now: datetime | None = None) -> QuerySet:
    """Shards with ``gpu_memory_used_mb`` (their latest fresh sample; None: none) and
    ``gpu_memory_budget_gb`` (their profile's share; None: whole GPUs), in the same query."""
    since = (now or timezone.now()) - LOAD_MAX_AGE
    sample = ShardLoad.objects.filter(
        node_id=OuterRef("node_id"), shard_id=OuterRef("pk"), sampled_at__gte=since
    )
    return shards.annotate(
        gpu_memory_used_mb=Subquery(sample.values("gpu_memory_mb")[:1]),
        gpu_memory_budget_gb=F("replica__profile__gpu_memory_gb"),
    )


def fresh_load(node: Node, now: datetime | None = None) -> NodeLoad | None:
    """The node's load sample if it is recent enough to describe the node now, else None."""
    try:
        load = node.load
    except NodeLoad.DoesNotExist:
        return None
    now = now or timezone.now()
    if now - load.sampled_at > LOAD_MAX_AGE:
        return None
    return load


def memory_gb(node: Node) -> str:
    """Total memory in GB for display; '-' when the agent did not say (never 0)."""
    if node.memory_total_mb is None:
        return "-"
    return gb_text(node.memory_total_mb)


def gpu_short_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100', 'NVIDIA A100-SXM4-80GB' -> 'A100'."""
    words = [w for w in re.split(r"[\s-]+", name.strip()) if w and w.lower() not in _GPU_NAME_NOISE]
    for word in words:
        if any(c.isdigit() for c in word):
            return word
    return words[0] if words else "?"


def gpu_summary(gpus) -> str:
    """'8×H100', '2×A100+1×L4', or '-' for a node without GPUs."""
    counts = Counter(gpu_short_name(g.name) for g in gpus)
    if not counts:
        return "-"
    return "+".join(f"{n}×{name}" for name, n in sorted(counts.items()))


def state_display(node: Node) -> str:
    """The observed state, with operator intent appended: 'ready,cordoned'."""
    parts = [node.state]
    if node.draining:
        parts.append("draining")
    elif node.cordoned:
        parts.append("cordoned")
    if not node.connected:
        parts.append("disconnected")
    return ",".join(parts)


@dataclass(frozen=True)
class NodeRow:
    """One line of the node table, as operators read it."""

    node: str
    state: str
    cpu_percent: str
    memory_gb: str
    gpus: str
    engines: str
    shards: str
    vllm_build: str = "auto"
    installs: str = "-"  # each wanted engine's install state (fleet.services.engines)


def node_rows(now: datetime | None = None) -> list[NodeRow]:
    """The node table: a few queries for the whole fleet."""
    now = now or timezone.now()
    nodes = (
        Node.objects.select_related("load")
        .prefetch_related(
            Prefetch("gpus", queryset=GPU.objects.only("node_id", "name")), "engine_installs"
        )
        .annotate(
            shard_count=Count("shards", distinct=True),
            ready_count=Count("shards", filter=Q(shards__state=ShardState.READY), distinct=True),
        )
    )
    rows = []
    for node in nodes:
        load = fresh_load(node, now)
        rows.append(
            NodeRow(
                node=node.pk,
                state=state_display(node),
                cpu_percent=f"{load.cpu_percent:.0f}" if load else "-",
                memory_gb=memory_gb(node),
                gpus=gpu_summary(node.gpus.all()),
                engines=",".join(sorted(node.engine_versions)) or "-",
                shards=f"{node.ready_count}/{node.shard_count}" if node.shard_count else "0",
                vllm_build=node.vllm_build,
                installs=installs_summary(node.engine_installs.all()),
            )
        )
    return rows
