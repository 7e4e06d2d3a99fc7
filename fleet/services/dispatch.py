"""Reaching agents from any process (Daphne, Celery, a management command).

The channel layer is at-most-once: a group_send to a full channel is dropped
and Redis can restart. So nothing here carries state that matters by itself.
Shards travel as a versioned desired set that the node's consumer rebuilds from
the database; a message here only rings the doorbell, and a lost ring is healed
by the next heartbeat, which carries the version the agent has.
"""

import asyncio
import logging
import uuid

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models import F

from agentd import protocol

logger = logging.getLogger(__name__)


def node_group(node_id: str) -> str:
    return f"node.{node_id}"


async def anotify_node(node_id: str, kind: str, **fields) -> None:
    layer = get_channel_layer()
    try:
        await layer.group_send(node_group(node_id), {"type": kind, **fields})
    except Exception:  # noqa: BLE001 - Redis down: the next sync heals it
        logger.warning("could not reach node %s through the channel layer", node_id, exc_info=True)


def notify_node(node_id: str, kind: str, **fields) -> None:
    async_to_sync(anotify_node)(node_id, kind, **fields)


def bump_desired(node_ids) -> None:
    """Say that these nodes' desired sets changed: a new version, then a doorbell after commit."""
    from fleet.models import Node

    ids = sorted(set(node_ids))
    if not ids:
        return
    Node.objects.filter(pk__in=ids).update(desired_version=F("desired_version") + 1)

    async def ring_all():
        # One event loop for every doorbell: a loop (and a Redis connection)
        # per node cost tens of milliseconds each when a pass touched thousands.
        from fleet.gateway.notify import achanged

        # A shard told to drain or stop must get no new request from now on, not
        # after the gateways' next periodic refresh.
        await asyncio.gather(*(anotify_node(n, "node.doorbell") for n in ids), achanged("routes"))

    transaction.on_commit(lambda: async_to_sync(ring_all)())


def desired_set(node_id: str) -> protocol.Desired:
    """The full desired set of a node, as the agent receives it."""
    from fleet.models import DesiredState, Node, Shard, ShardState

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


class NodeUnreachable(Exception):
    """The node did not answer in time (not connected, or an agent too old to answer)."""


async def arequest_logs(
    node_id: str, source: str = "agent", lines: int = 200
) -> protocol.LogsReply:
    """Ask a node for its recent log lines, from any process. Bounded by LOGS_TIMEOUT_S."""
    layer = get_channel_layer()
    reply_channel = await layer.new_channel("logs.")
    request_id = uuid.uuid4().hex
    await anotify_node(
        node_id,
        "node.logs_request",
        request_id=request_id,
        source=source,
        lines=lines,
        reply_channel=reply_channel,
    )
    timeout = settings.LLMGW["LOGS_TIMEOUT_S"]
    # Bounded because a person is waiting: an agent that never answers (gone, or
    # older than the request) must not hang the page.
    try:
        async with asyncio.timeout(timeout):
            while True:
                msg = await layer.receive(reply_channel)
                if msg.get("request_id") == request_id:
                    return protocol.LogsReply.model_validate(msg["reply"])
    except TimeoutError:
        raise NodeUnreachable(f"node {node_id} did not answer within {timeout:g} s") from None


def request_logs(node_id: str, source: str = "agent", lines: int = 200) -> protocol.LogsReply:
    """arequest_logs for sync code: a Celery task, a command, a sync view.

    Not from inside database_sync_to_async in a process serving agent sockets:
    that thread is the one every consumer there needs for the database, so the
    node's own consumer could not pass the request on until the wait ran out.
    """
    return async_to_sync(arequest_logs)(node_id, source, lines)
