"""Every doorbell rung through the channel layer: one node's socket, or every gateway.

The channel layer is at-most-once: a group_send to a full channel is dropped
and Redis can restart. So a ring carries no state that matters by itself: it
only says "look again". A node's socket then rebuilds the desired set from the
database (``fleet.services.desired``), and a lost ring is healed by the next
heartbeat, which carries the version the agent has; a gateway reloads its
routes and keys, and a lost ring is healed by its periodic refresh.

Rings go out after the current transaction commits (``transaction.on_commit``;
at once outside a transaction), so nobody looks before the change is there to
see. The group names and event types are the constants below: the agents'
consumer and the gateways listen on exactly these.
"""

import asyncio
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

# Every gateway process joins this group; a ring makes each reload its table.
GATEWAYS_GROUP = "llmgw.gateways"
GATEWAY_REFRESH = "gateway.refresh"

# Each agent socket joins its node's group (``node_group``). The event types
# are the consumer's handlers: "node.doorbell" is handled by node_doorbell.
NODE_DOORBELL = "node.doorbell"  # the desired set changed: send it again
NODE_SUPERSEDE = "node.supersede"  # the same node connected again elsewhere
NODE_REVOKED = "node.revoked"  # its credential may have been revoked: check
NODE_LOGS_REQUEST = "node.logs_request"  # pass a logs request on to the agent
NODE_PROVISION = "node.provision"  # the wanted engines or the node's vLLM build changed
NODE_REMOVE_WEIGHTS = "node.remove_weights"  # a clean-up proposal waits: check and send it


async def process_channel(layer) -> str:
    """A channel of this process's own, for a listener that is not a consumer.

    Always the layer's default prefix, the one Channels gives every consumer:
    channels_redis has one receive lock per process, and its holder waits (up to
    5 s at a time) only on the Redis list its own channel's prefix names. A
    listener with a prefix of its own (a gateway's, a logs reply's) held every
    agent socket's doorbells and logs requests back while it waited.
    """
    return await layer.new_channel()


def node_group(node_id: str) -> str:
    return f"node.{node_id}"


async def aring_node(node_id: str, kind: str = NODE_DOORBELL, **fields) -> None:
    """Ring one node's socket now, from async code."""
    layer = get_channel_layer()
    try:
        await layer.group_send(node_group(node_id), {"type": kind, **fields})
    except Exception:  # noqa: BLE001 - Redis down: the next heartbeat heals it
        logger.warning("could not reach node %s through the channel layer", node_id, exc_info=True)


async def aring_gateways(what: str = "all") -> None:
    """Ring every gateway now, from async code: reload ``what`` ("routes", "keys", "all")."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(GATEWAYS_GROUP, {"type": GATEWAY_REFRESH, "what": what})
    except Exception:  # noqa: BLE001 - Redis down: the periodic refresh heals it
        logger.warning("could not ring the gateways through the channel layer", exc_info=True)


# The web process's event loop, once an agent socket has opened on it. Its agent
# sockets' database work runs in threads beside it (fleet.sockets.db, the
# heartbeat and registration writers), and what they commit rings doorbells. From
# such a thread async_to_sync would make a new event loop and new Redis connections
# for every ring (redis-py reads its own version from the installed packages for
# each one): at 5,000 agents those threads held the GIL long enough to stall the
# web process's loop for 0.4-1.1 s at a time (docs/benchmarks.md, Agent sockets).
# A ring from one of them goes out on this loop instead, through its connections.
_home: asyncio.AbstractEventLoop | None = None
_sending: set = set()


def ring_from_threads_on(loop: asyncio.AbstractEventLoop) -> None:
    """Send the rings this process's database threads make on ``loop`` (the web
    process's own, which serves the agent sockets)."""
    global _home
    _home = loop


def run_ring(coro_fn, *args, **kwargs) -> None:
    """Run ``coro_fn(*args, **kwargs)``: on the web process's loop from a thread beside
    it (without waiting: rings are at-most-once anyway), else with async_to_sync."""
    loop = _home
    if loop is not None and loop.is_running():
        try:
            on_it = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_it = False
        if not on_it:
            future = asyncio.run_coroutine_threadsafe(coro_fn(*args, **kwargs), loop)
            _sending.add(future)
            future.add_done_callback(_sending.discard)
            return
    async_to_sync(coro_fn)(*args, **kwargs)


def ring_node(node_id: str, kind: str = NODE_DOORBELL, **fields) -> None:
    """Ring one node's socket once the current transaction commits."""
    transaction.on_commit(lambda: run_ring(aring_node, node_id, kind, **fields))


def ring_gateways(what: str = "all") -> None:
    """Ring every gateway once the current transaction commits.

    Call it after anything that changes where requests may go (a shard's
    state, a replica added or drained, a model renamed) or which keys are valid.
    """
    transaction.on_commit(lambda: run_ring(aring_gateways, what))
