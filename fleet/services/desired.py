"""A node's desired set: the shards it should run, versioned, as the agent receives it.

Shards are synchronised declaratively (docs/protocol.md): whenever a node's
shards change, its version goes up and its socket is rung after commit; the
consumer then sends the whole set again, rebuilt here from the database. The
agent converges to the newest version it has seen and ignores older ones, so a
lost ring is healed by the next heartbeat (it carries the agent's version) and
a duplicate changes nothing.
"""

import asyncio

from asgiref.sync import async_to_sync
from django.db import transaction
from django.db.models import F

from agentd import protocol
from fleet.models import DesiredState, Node, Shard, ShardState

from . import doorbells


def bump_desired(node_ids) -> None:
    """Say that these nodes' desired sets changed: a new version, then a doorbell after commit."""
    ids = sorted(set(node_ids))
    if not ids:
        return
    Node.objects.filter(pk__in=ids).update(desired_version=F("desired_version") + 1)

    async def ring_all():
        # One event loop for every doorbell: a loop (and a Redis connection)
        # per node cost tens of milliseconds each when a pass touched thousands.
        # The gateways too: a shard told to drain or stop must get no new
        # request from now on, not after their next periodic refresh.
        await asyncio.gather(
            *(doorbells.aring_node(n) for n in ids), doorbells.aring_gateways("routes")
        )

    transaction.on_commit(lambda: async_to_sync(ring_all)())


def desired_set(node_id: str) -> protocol.Desired:
    """The full desired set of a node, as the agent receives it."""

    version = Node.objects.filter(pk=node_id).values_list("desired_version", flat=True).first()
    shards = (
        Shard.objects.filter(node_id=node_id)
        .exclude(
            desired_state=DesiredState.STOPPED,
            state__in=[ShardState.STOPPED, ShardState.FAILED],
        )
        .select_related("replica__model", "replica__profile")
    )
    out = []
    for s in shards:
        p = s.replica.profile
        # What the shard was placed with (the reconciler keeps it on the row):
        # the agent restarts an engine whose spec changes, so an edit to the
        # profile must reach running shards as a rolling replacement, not here.
        spec = s.spec or p.spec()
        out.append(
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
                port=s.port or 0,
                startup_timeout_s=p.startup_timeout_s,
                profile=protocol.ProfileSpec(**spec["profile"]),
            )
        )
    return protocol.Desired(type="desired", version=version or 0, shards=out)
