"""The end of a reconciler pass: finished drains, what agents reported at registration,
and forgetting rows nothing needs any more."""

import logging

from django.db.models import F

from fleet import audit
from fleet.models import (
    SHARD_FINISHED,
    DesiredState,
    Node,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
)

logger = logging.getLogger(__name__)


def finish_drains(draining_nodes, report) -> None:
    """A draining node with nothing left on it stops draining and stays cordoned."""
    for node_id in draining_nodes:
        busy = Shard.objects.filter(node_id=node_id).exclude(desired_state=DesiredState.STOPPED)
        if not busy.exists() and Node.objects.filter(pk=node_id, draining=True).update(
            draining=False, cordoned=True
        ):
            logger.info("node drained node=%s (stays cordoned)", node_id)
            audit.record(Node(pk=node_id), {"draining": (True, False)})
            report.drains_finished += 1


def check_registrations(since, touched: set, report) -> None:
    """Shards agents reported at registration: adopted, duplicates, or unclaimed.

    Each node's desired set already says what to keep; a shard it does not
    name is stopped by the agent. This says so in the log, once per
    registration (``since`` is the previous pass), and rings the node so it
    hears the current set.
    """
    nodes = Node.objects.exclude(running_shards=[])
    if since is not None:
        nodes = nodes.filter(registered_at__gte=since)
    for node_id, running in nodes.values_list("pk", "running_shards"):
        ids = [s.get("shard_id") for s in running]
        known = dict(
            Shard.objects.filter(pk__in=ids, node_id=node_id).values_list("pk", "desired_state")
        )
        for shard_id in ids:
            desired = known.get(shard_id)
            if desired is None:
                logger.warning(
                    "unclaimed shard on node: nothing claims it, stopping it node=%s shard=%s",
                    node_id,
                    shard_id,
                )
            elif desired == DesiredState.STOPPED:
                logger.warning(
                    "duplicate shard on a returning node, stopping it node=%s shard=%s",
                    node_id,
                    shard_id,
                )
            else:
                report.adopted += 1
                continue
            report.unclaimed += 1
            touched.add(node_id)


def clean_up(touched: set, report) -> None:
    """Forget shards the agent no longer runs, and replicas with nothing left."""
    # Only once the agent has applied the set that stopped them: until then the
    # set must keep saying "stopped". Nodes this pass changed are not synced.
    synced = Node.objects.filter(acked_version__gte=F("desired_version")).exclude(pk__in=touched)
    gone = Shard.objects.filter(desired_state=DesiredState.STOPPED, node__isnull=True) | (
        Shard.objects.filter(
            desired_state=DesiredState.STOPPED,
            state__in=[*SHARD_FINISHED, ShardState.PENDING],
            node__in=synced,
        )
    )
    deleted, _ = gone.delete()
    report.deleted += deleted
    Replica.objects.filter(state=ReplicaState.STOPPED, shards__isnull=True).delete()
