"""Asking a node for its recent log lines, from any process, with a deadline.

The request goes to the node's socket through the channel layer
(``doorbells.NODE_LOGS_REQUEST``), the consumer passes it to the agent, and
the agent's reply comes back on a channel of the asker's own.
"""

import asyncio
import uuid

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from agentd import protocol
from fleet.conf import fleet_settings

from . import doorbells


class NodeUnreachable(Exception):
    """The node did not answer in time (not connected, or an agent too old to answer)."""


async def arequest_logs(
    node_id: str, source: str = "agent", lines: int = 200
) -> protocol.LogsReply:
    """Ask a node for its recent log lines, from any process. Bounded by LOGS_TIMEOUT_S."""
    layer = get_channel_layer()
    reply_channel = await doorbells.process_channel(layer)
    request_id = uuid.uuid4().hex
    await doorbells.aring_node(
        node_id,
        doorbells.NODE_LOGS_REQUEST,
        request_id=request_id,
        source=source,
        lines=lines,
        reply_channel=reply_channel,
    )
    timeout = fleet_settings().logs_timeout_s
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
