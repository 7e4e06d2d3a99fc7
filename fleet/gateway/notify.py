"""Tell every gateway process to reload its routing table and keys.

Call ``changed()`` (sync, e.g. from ``transaction.on_commit``) or
``achanged()`` after anything that changes where requests may go — a shard's
state, a replica added or drained, a model renamed — or which keys are valid.
It is a doorbell, at most once like everything on the channel layer: a lost
ring is healed by each gateway's periodic refresh a few seconds later.
"""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

GROUP = "llmgw.gateways"
EVENT = "gateway.refresh"


async def achanged(what: str = "all") -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(GROUP, {"type": EVENT, "what": what})
    except Exception:  # noqa: BLE001 - Redis down: the periodic refresh heals it
        logger.warning("could not ring the gateways through the channel layer", exc_info=True)


def changed(what: str = "all") -> None:
    async_to_sync(achanged)(what)
