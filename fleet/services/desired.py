"""A node's desired set: the shards it should run, versioned, as the agent receives it.

Shards are synchronised declaratively (docs/protocol.md): whenever a node's
shards change, its version goes up and its socket is rung after commit; the
consumer then sends the whole set again, rebuilt here from the database. The
agent converges to the newest version it has seen and ignores older ones, so a
lost ring is healed by the next heartbeat (it carries the agent's version) and
a duplicate changes nothing.
"""

import asyncio
from contextlib import contextmanager
from datetime import datetime

from django.db import transaction
from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from agentd import protocol
from fleet.conf import fleet_settings
from fleet.models import DesiredState, Node, Shard, ShardState

from . import adapters, doorbells

# ---- keeping up -----------------------------------------------------------------
#
# ``Node.desired_lag_since`` says since when a node's acknowledged version has
# been behind its desired one without progress: set when the desired version
# moves ahead of a caught-up node, restarted when an ack moves forward without
# catching up (the node is converging, a version at a time), cleared when it
# catches up. Every writer of either version keeps it so: ``bump_desired``, the
# ack (``inventory.apply_desired_ack``), registration, and both heartbeat
# writers (``heartbeat.orm``, and ``heartbeat.pg`` in SQL, the same rule).


def lag_since_after(acked, now: datetime):
    """``desired_lag_since`` for an update setting ``acked_version`` to ``acked`` (a value
    or an expression over the row as it was), in the same statement."""
    return Case(
        When(Q(desired_version__lte=acked), then=Value(None)),
        When(
            Q(acked_version__lt=acked) | Q(desired_lag_since__isnull=True),
            then=Value(now),
        ),
        default=F("desired_lag_since"),
        output_field=DateTimeField(),
    )


def not_keeping_up(
    connected: bool, lag_since: datetime | None, now: datetime, bound_s: float | None = None
) -> bool:
    """A connected node behind its desired version, without progress, for longer than the
    bound (``LLMGW_DESIRED_LAG_BOUND_S``). A disconnected node is not judged: it cannot
    hear, and its silence has timers of its own (suspect, lost)."""
    if not connected or lag_since is None:
        return False
    bound = fleet_settings().desired_lag_bound_s if bound_s is None else bound_s
    return (now - lag_since).total_seconds() > bound


def lag_s(lag_since: datetime | None, now: datetime) -> float:
    """Seconds behind without progress; 0 when caught up."""
    return max(0.0, (now - lag_since).total_seconds()) if lag_since else 0.0


# ---- versions and the set ----------------------------------------------------------


@contextmanager
def locked_nodes(ids):
    """A transaction (the caller's, else one of its own) holding these nodes' rows
    locked, taken in id order.

    Every write to many nodes at once takes them in this order first (the
    heartbeat statement in the same order), so two such writes wait for each
    other instead of deadlocking."""
    with transaction.atomic(savepoint=False):
        list(Node.objects.filter(pk__in=ids).order_by("pk").select_for_update().values_list("pk"))
        yield


def bump_desired(node_ids) -> None:
    """Say that these nodes' desired sets changed: a new version, then a doorbell after commit."""
    ids = sorted(set(node_ids))
    if not ids:
        return
    # acked_version never passes desired_version, so the node is behind now;
    # one already behind keeps the time it fell behind.
    with locked_nodes(ids):
        Node.objects.filter(pk__in=ids).update(
            desired_version=F("desired_version") + 1,
            desired_lag_since=Coalesce(F("desired_lag_since"), Value(timezone.now())),
        )

    async def ring_all():
        # One event loop for every doorbell: a loop (and a Redis connection)
        # per node cost tens of milliseconds each when a pass touched thousands.
        # The gateways too: a shard told to drain or stop must get no new
        # request from now on, not after their next periodic refresh.
        await asyncio.gather(
            *(doorbells.aring_node(n) for n in ids), doorbells.aring_gateways("routes")
        )

    transaction.on_commit(lambda: doorbells.run_ring(ring_all))


def _max_adapters(shard: Shard) -> int:
    return ((shard.spec or {}).get("profile") or {}).get("max_adapters", 0)


def desired_set(node_id: str) -> protocol.Desired:
    """The full desired set of a node, as the agent receives it."""
    version = Node.objects.filter(pk=node_id).values_list("desired_version", flat=True).first()
    return desired_sets({node_id: version or 0})[node_id]


def desired_sets(versions: dict[str, int]) -> dict[str, protocol.Desired]:
    """The full desired sets of these nodes (node id -> its desired version), in one read:
    a batch of registrations sends every node its set."""
    shards = (
        Shard.objects.filter(node_id__in=list(versions))
        .exclude(
            desired_state=DesiredState.STOPPED,
            state__in=[ShardState.STOPPED, ShardState.FAILED],
        )
        .select_related("replica__model", "replica__profile")
    )
    out: dict[str, list] = {node_id: [] for node_id in versions}
    shards = list(shards)
    lora = adapters.by_model({s.replica.model_id for s in shards if _max_adapters(s)})
    for s in shards:
        p = s.replica.profile
        # What the shard was placed with (the reconciler keeps it on the row):
        # the agent restarts an engine whose spec changes, so an edit to the
        # profile must reach running shards as a rolling replacement, not here.
        spec = s.spec or p.spec()
        out[s.node_id].append(
            protocol.DesiredShard(
                shard_id=s.id,
                replica_id=s.replica_id,
                model=spec["model"],
                state=s.desired_state,
                rank=s.rank,
                nnodes=spec["profile"]["nodes"],
                leader_addr=spec.get("leader_addr", ""),
                leader_port=spec.get("leader_port", 0),
                gpu_uuids=s.gpu_uuids,
                hcas=s.hcas,
                # Recorded at placement for multi-node replicas (reconciler.placing),
                # so a node re-reporting its interface restarts no running engine.
                mgmt_interface=spec.get("mgmt_interfaces", {}).get(s.node_id, ""),
                fabric=spec.get("fabric", ""),
                port=s.port or 0,
                startup_timeout_s=p.startup_timeout_s,
                gpu_memory_fraction=spec.get("gpu_memory_fraction", 0),
                gpu_layers=spec.get("gpu_layers", -1),
                kv_cache_gb=spec.get("kv_cache_gb", 0),
                sleep_level=spec.get("sleep_level", 0),
                rpc_servers=spec.get("rpc_servers", []),
                profile=protocol.ProfileSpec(**spec["profile"]),
                adapters=adapters.specs(lora.get(s.replica.model_id, ()), _max_adapters(s)),
            )
        )
    return {
        node_id: protocol.Desired(
            type="desired", version=versions[node_id] or 0, shards=out[node_id]
        )
        for node_id in versions
    }
