"""What other processes ask of a node's socket, through the channel layer: the doorbells.

Any process rings a node (``fleet.services.doorbells``): its desired set
changed (``node.doorbell``), its wanted engines did (``node.provision``), a
clean-up proposal is ready (``node.remove_weights``), the same node connected
again elsewhere (``node.supersede``), its credential was revoked
(``node.revoked``), an operator asks for its logs (``node.logs_request``). A
mixin of ``consumer.AgentConsumer``, which Channels calls with each event by its
type; it sends through the consumer's ``send_msg`` and closes through its
``refuse``. This changes when a doorbell is added; the agent's own messages are
the consumer's.
"""

import asyncio
import logging

from channels.db import database_sync_to_async

from agentd import protocol
from agentd.protocol import CloseCode
from fleet.services import access, engines
from fleet.services.weights_gc import delivery

from . import db as socket_db

logger = logging.getLogger("fleet.sockets.consumer")  # where operators read about agent sockets

# How long a clean-up proposal waits for a reconciler pass to release the lock.
REMOVAL_LOCK_WAIT_S = 30


class NodeEvents:
    async def node_doorbell(self, event):
        if not self.closing:
            await self.send_desired()

    async def node_provision(self, event):
        if not self.closing:
            await self.send_msg(await socket_db.call(engines.provision_for, self.node_id))

    async def node_remove_weights(self, event):
        """A clean-up proposal for this node: sent while still current (``delivery.deliver``).

        In a task of its own: waiting for a reconciler pass to release its lock
        must not hold up this socket's heartbeats.
        """
        if not self.closing:
            task = asyncio.ensure_future(self._deliver_removal(event))
            self._removals = getattr(self, "_removals", set())
            self._removals.add(task)
            task.add_done_callback(self._removals.discard)

    async def _deliver_removal(self, event):
        loop = asyncio.get_running_loop()

        def send(msg):
            # On the database thread, under the lock: the message is on the
            # socket before the lock goes, and so before any later placement's set.
            asyncio.run_coroutine_threadsafe(self.send_msg(msg), loop).result(timeout=10)

        deadline = loop.time() + REMOVAL_LOCK_WAIT_S
        while not self.closing:
            try:
                result = await database_sync_to_async(delivery.deliver)(
                    self.node_id, event["request_id"], int(event["desired_version"]), send
                )
            except Exception:  # noqa: BLE001 - the entries time out and a later pass retries
                logger.warning("weights removal not delivered node=%s", self.node_id, exc_info=True)
                return
            if result != delivery.BUSY or loop.time() > deadline:
                return
            await asyncio.sleep(0.2)

    async def node_supersede(self, event):
        if event.get("channel") != self.channel_name:
            await self.refuse(CloseCode.SUPERSEDED, "the same node connected again")

    async def node_revoked(self, event):
        if await socket_db.call(access.credential_revoked, self.identity.credential_id):
            await self.refuse(CloseCode.REVOKED, "credential revoked")

    async def node_logs_request(self, event):
        if self.closing:
            return
        # An agent that never answers must not grow this forever: the asker has
        # long given up on all but the newest few requests.
        while len(self.logs_waiting) >= 32:
            self.logs_waiting.pop(next(iter(self.logs_waiting)))
        self.logs_waiting[event["request_id"]] = event["reply_channel"]
        await self.send_msg(
            protocol.LogsRequest(
                type="logs_request",
                request_id=event["request_id"],
                source=event.get("source") or "agent",
                lines=event.get("lines") or 200,
            )
        )
