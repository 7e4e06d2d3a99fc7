"""Coalescing heartbeat writes.

Each consumer hands its heartbeat to the batcher of its event loop and waits;
the batcher writes everything that arrived in the last few milliseconds in one
transaction, so a thousand agents cost a few queries a flush, not a few
thousand. GPUStack reached 200 workers only after batching its heartbeat
writes; this is the same idea from the start.
"""

import asyncio
import logging
import weakref

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from agentd import protocol
from fleet.services import inventory

logger = logging.getLogger(__name__)


class HeartbeatBatcher:
    def __init__(self, delay: float):
        self.delay = delay
        self.pending: list[tuple[tuple, asyncio.Future]] = []
        self.task: asyncio.Task | None = None

    async def submit(
        self, node_id: str, credential_id: int, hb: protocol.Heartbeat
    ) -> inventory.HeartbeatResult:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append(((node_id, credential_id, hb, timezone.now()), fut))
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._flush_soon())
        return await fut

    async def _flush_soon(self) -> None:
        while self.pending:
            await asyncio.sleep(self.delay)
            batch, self.pending = self.pending, []
            try:
                results = await database_sync_to_async(inventory.apply_heartbeats)(
                    [item for item, _ in batch]
                )
            except Exception as exc:  # noqa: BLE001 - every waiter must hear of it
                logger.exception("writing %d heartbeats failed", len(batch))
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for item, fut in batch:
                if not fut.done():
                    fut.set_result(results[item[0]])


_batchers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HeartbeatBatcher]" = (
    weakref.WeakKeyDictionary()
)


def batcher() -> HeartbeatBatcher:
    loop = asyncio.get_running_loop()
    b = _batchers.get(loop)
    if b is None:
        b = _batchers[loop] = HeartbeatBatcher(settings.LLMGW["HEARTBEAT_FLUSH_S"])
    return b
