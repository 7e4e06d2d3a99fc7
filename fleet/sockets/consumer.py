"""The agents' socket at /ws/agent/: one per node, held for the agent's lifetime."""

import asyncio
import dataclasses
import logging
import time

from channels.consumer import get_handler_name
from channels.exceptions import ChannelFull
from channels.generic.websocket import AsyncWebsocketConsumer

from agentd import protocol
from agentd.protocol import CloseCode, ProtocolError
from fleet.conf import fleet_settings
from fleet.metrics import AGENT_LOGS_REPLIES_DROPPED
from fleet.models import Node
from fleet.models.access import bearer_secret
from fleet.services import (
    access,
    desired,
    doorbells,
    gpu_health,
    heartbeat,
    inventory,
    registration,
)
from fleet.services.heartbeat import ReportMemo, batcher
from fleet.services.weights_gc import delivery

from . import admission, groups, metering, registrations
from . import db as socket_db
from .events import NodeEvents
from .peer import connection_peer

logger = logging.getLogger(__name__)


REGISTER_TIMEOUT_S = 10
# agentd gives up on a handshake after 10 s and on the register's ack after 15 s
# (agentd/client.py): work for a socket queued longer than this is not done.
HANDSHAKE_DEADLINE_S = 9
REGISTER_DEADLINE_S = 13
# Closed sockets' nodes marked disconnected in one transaction, at most this many:
# the rows stay locked while it runs, and heartbeats of those nodes wait for it.
DISCONNECTS_MAX_BATCH = 500


def _header_values(scope, name: str) -> list[str]:
    key = name.lower().encode("latin-1")
    return [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == key]


def _bearer(scope) -> str:
    """The agent's secret; "" when it sent none (or not as Bearer), which identifies no one."""
    try:
        return bearer_secret(scope.get("headers", [])) or ""
    except ValueError:
        return ""


class AgentConsumer(NodeEvents, AsyncWebsocketConsumer):
    """Validates every message, then hands it to a service. Holds no fleet state of its own.

    One node cannot crowd out the others: Channels hands a consumer its messages
    one at a time (the next is read only when the last one's handler returned),
    so a socket never has more than one message waiting on the shared database
    thread or in a heartbeat batch; and each socket's messages and bytes are
    metered (``metering``) before they are parsed, so a node sending more
    than an agent ever would is closed with 4029 before it costs much. A log
    reply answering the control plane's own request is not the agent's doing:
    its charge is given back (``receive``), so an operator following a node's
    logs never gets its socket closed.
    """

    identity: access.AgentIdentity | None = None
    node_id: str | None = None
    acked_version = 0  # the node's acknowledged version as this socket's registration wrote it
    closing = False
    released = False
    admitted = False  # counted against this process's admission limit (fleet.sockets.admission)
    foreign_shards: tuple[str, ...] = ()  # last logged: shard loads dropped as not this node's

    async def connect(self):
        host, port = self.scope.get("client") or ("?", "?")
        self.client = f"{host}:{port}"
        self.logs_waiting: dict[str, str] = {}
        # What this socket's database threads commit rings doorbells on this loop.
        doorbells.ring_from_threads_on(asyncio.get_running_loop())
        # Past what this process takes through registration at once, come back later:
        # answered now rather than queued past the agent's own wait.
        self.gate = admission.admission()
        if not self.gate.enter():
            await self.try_later("too many agents registering at once", "busy")
            return
        self.admitted = True
        # With LLMGW_CLIENT_CERT_PROXIES set: the node a verified client
        # certificate names, or why this socket has none that counts.
        cert = access.client_cert_node(
            connection_peer(self.scope), _header_values(self.scope, access.CLIENT_CERT_HEADER)
        )
        # Authenticate before accept: an unknown agent never gets an open socket.
        try:
            self.identity = await socket_db.call_by(
                time.monotonic() + HANDSHAKE_DEADLINE_S, access.identify, _bearer(self.scope)
            )
        except socket_db.TooLate:
            self.through(registered=False)
            await self.try_later("too busy to check the credential in time", "slow_check")
            return
        if self.identity is None:
            self.through(registered=False)
            logger.warning(
                "agent refused: no valid credential or join token client=%s", self.client
            )
            await self.close()
            return
        self.identity = dataclasses.replace(self.identity, cert_node_id=cert.node_id)
        self.meter = metering.Meter(time.monotonic())
        await self.accept()
        # Whatever serves the socket (uvicorn, Daphne), its open and its end are in this log.
        logger.info("agent socket open client=%s", self.client)
        if cert.refusal:
            # Accepted first so the agent hears why (4003, as for a credential for another node).
            await self.refuse(CloseCode.FORBIDDEN, cert.refusal)
            return
        self.register_deadline = asyncio.get_running_loop().call_later(
            REGISTER_TIMEOUT_S, lambda: asyncio.ensure_future(self._register_overdue())
        )

    def through(self, registered: bool) -> None:
        """This socket no longer counts against the admission limit (once)."""
        if self.admitted:
            self.admitted = False
            self.gate.leave(registered)

    async def try_later(self, why: str, kind: str) -> None:
        """Turn the handshake away for now, saying when to come back.

        A server with ASGI's denial-response extension (uvicorn) answers the
        handshake with a status of its own: 503 and Retry-After, for nearly
        nothing. One without it (Daphne, under ``runserver``) would refuse with a
        403, which agentd takes as "this credential is refused" and stops: there
        the socket is accepted and closed with 4013, and the agent backs off.

        Counted and logged by ``admission.turn_away``.
        """
        after, told = admission.turn_away(self.gate, kind, why, self.client)
        if "websocket.http.response" in (self.scope.get("extensions") or {}):
            body = f"{told}\n".encode()
            await self.base_send(
                {
                    "type": "websocket.http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"retry-after", str(after).encode()),
                    ],
                }
            )
            await self.base_send({"type": "websocket.http.response.body", "body": body})
            return
        await self.accept()
        await self.refuse(CloseCode.TRY_AGAIN, told)

    async def _register_overdue(self):
        if self.node_id is None:
            await self.refuse(
                CloseCode.NOT_REGISTERED, f"no register within {REGISTER_TIMEOUT_S} s"
            )

    async def refuse(self, code: CloseCode, reason: str) -> None:
        """Close with a documented code. Logged once; nothing is written."""
        if self.closing:
            return
        self.closing = True
        logger.warning(
            "agent socket closed code=%d reason=%s node=%s client=%s",
            code,
            reason,
            self.node_id or "-",
            self.client,
        )
        # Daphne drops a close frame's reason (django/daphne#374), so the agent
        # hears it in a last message; the frame keeps the code.
        try:
            await self.send_msg(
                protocol.Closing(type="closing", code=int(code), reason=reason[:4096])
            )
            await self.close(code=int(code), reason=reason[:120])
        except (RuntimeError, OSError):
            # The agent is gone already (it gave up waiting): nobody to tell.
            # Daphne says so with a RuntimeError, uvicorn with an OSError.
            pass

    async def dispatch(self, message):
        # Channels would first close stale database connections, with a hop to
        # the shared database thread, before every message: a heartbeat would
        # queue behind other agents' registrations just to be read. Every
        # database call here goes through fleet.sockets.db (or the
        # heartbeat writer), which looks after its connections itself.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def receive(self, text_data=None, bytes_data=None):
        if self.closing:
            return
        self.received_at = time.monotonic()
        charged = self.meter.charge(text_data, bytes_data, self.received_at)
        # Past the limits, a message is read only while a log request is waiting
        # for its reply, and the socket is closed after it unless it was that
        # reply: one message at most, of at most the 1 MiB Daphne takes.
        if charged is None and not self.logs_waiting:
            await self.rate_limited()
            return
        if bytes_data is not None:
            await self.refuse(
                CloseCode.INVALID_MESSAGE, "binary frames are not part of the protocol"
            )
            return
        try:
            msg = protocol.parse_agent_message(text_data)
        except ProtocolError as exc:
            await self.refuse(exc.code, exc.reason)
            return
        if msg.type == "logs_reply" and msg.request_id in self.logs_waiting:
            # Asked for by the control plane (an operator following the logs),
            # not sent of the agent's own accord: it costs the socket nothing.
            if charged is not None:
                self.meter.give_back(charged)
        elif charged is None:
            await self.rate_limited()
            return
        if self.node_id is None and msg.type != "register":
            await self.refuse(CloseCode.NOT_REGISTERED, f"'{msg.type}' before 'register'")
            return
        handler = getattr(self, f"on_{msg.type}")
        try:
            await handler(msg)
        except access.Revoked:
            # Found on the write path, so nothing was written; the doorbell
            # that should have closed this socket was lost, or is on its way.
            await self.refuse(CloseCode.REVOKED, "credential revoked or node removed")

    async def rate_limited(self) -> None:
        await self.refuse(CloseCode.RATE_LIMITED, metering.limits())

    async def write(self, fn, *args, **kwargs):
        """A write this socket's message makes, done only while its credential holds
        (``access.as_node``); raises access.Revoked, having written nothing, if not."""
        return await socket_db.call(
            access.as_node, self.identity.credential_id, self.node_id, fn, *args, **kwargs
        )

    # ---- agent -> control plane ------------------------------------------------

    async def on_register(self, msg: protocol.Register):
        # The register is here: the deadline was for the agent to send it, not
        # for a busy control plane to get through its queue of registrations.
        self.register_deadline.cancel()
        # Before anything is written, a join token's use included.
        refusal = access.mgmt_addr_refusal(msg.mgmt_addr, (self.scope.get("client") or [None])[0])
        if refusal:
            await self.refuse(CloseCode.FORBIDDEN, refusal)
            return
        if self.node_id is not None and msg.node_id != self.node_id:
            await self.refuse(
                CloseCode.FORBIDDEN,
                f"this socket is node '{self.node_id}'; it cannot register as '{msg.node_id}'",
            )
            return
        secret = None
        again = self.node_id is not None
        if not again:
            try:
                if self.identity.enrolling:
                    # Under the same deadline: a credential issued after the agent
                    # stopped waiting would never reach it, and the node could not
                    # enrol again with the token.
                    self.identity, secret = await socket_db.call_by(
                        self.received_at + REGISTER_DEADLINE_S,
                        access.enrol,
                        self.identity,
                        msg.node_id,
                    )
                else:
                    access.check_node(self.identity, msg.node_id)  # all a credential needs
            except socket_db.TooLate:
                await self.refuse(CloseCode.TRY_AGAIN, "too busy to register in time; try again")
                return
            except access.EnrolmentError as exc:
                await self.refuse(CloseCode.FORBIDDEN, str(exc))
                return
            self.node_id = msg.node_id
            heartbeat.attach()
            self.group = doorbells.node_group(self.node_id)
            await groups.join(self.channel_layer, self.group, self.channel_name)
            # A reconnect while the old socket still looks open: the new one
            # wins, since the old is by definition the dead one.
            await doorbells.aring_node(
                self.node_id, doorbells.NODE_SUPERSEDE, channel=self.channel_name
            )
        # The write, and what the agent is sent next, in one batch with the other
        # registrations arriving meanwhile (fleet.services.registration).
        # Once a credential is issued it must reach the agent: no deadline then.
        try:
            sent = await registrations.registrations().submit(
                registration.Registration(
                    credential_id=self.identity.credential_id,
                    msg=msg,
                    channel_name=self.channel_name,
                    deadline=None if secret else self.received_at + REGISTER_DEADLINE_S,
                    again=again,
                )
            )
        except socket_db.TooLate:
            await self.refuse(CloseCode.TRY_AGAIN, "too busy to register in time; try again")
            return
        provision, desired_set = sent.provision, sent.desired
        self.acked_version = sent.acked_version
        # A register rewrites the GPU and storage rows: whatever was written before is no guide.
        self.memo = ReportMemo()
        await self.send_msg(
            protocol.ServerAck(
                type="ack",
                of="register",
                node_id=self.node_id,
                credential=secret,
                heartbeat_interval_s=fleet_settings().heartbeat_interval_s,
            )
        )
        self.through(registered=True)
        # Always, empty too: a node away when the last wanted engine was removed
        # restored its installs at start and would advertise them for ever.
        await self.send_msg(provision)
        await self.send_msg(desired_set)

    async def on_heartbeat(self, msg: protocol.Heartbeat):
        result = await batcher().submit(self.node_id, self.identity.credential_id, msg, self.memo)
        if result.revoked:
            raise access.Revoked(self.node_id)  # and the writer wrote nothing of it
        if result.foreign_shards != self.foreign_shards:
            # Logged when it changes, not every heartbeat: the rest of the heartbeat
            # was written, so this is a confused agent, not a refused message.
            self.foreign_shards = result.foreign_shards
            if result.foreign_shards:
                logger.warning(
                    "load for shards this node does not hold dropped node=%s shards=%s",
                    self.node_id,
                    ",".join(result.foreign_shards),
                )
        await self.send_msg(
            protocol.ServerAck(type="ack", of="heartbeat", node_id=self.node_id, seq=msg.seq)
        )
        if msg.desired_version < result.desired_version:
            # A doorbell was lost somewhere: heal it now.
            await self.send_desired()

    async def on_shard_status(self, msg: protocol.ShardStatus):
        await self.write(inventory.apply_shard_status, self.node_id, msg)

    async def on_fetch_progress(self, msg: protocol.FetchProgress):
        await self.write(inventory.apply_fetch_progress, self.node_id, msg)

    async def on_gpu_events(self, msg: protocol.GPUEvents):
        await self.write(gpu_health.apply_gpu_events, self.node_id, msg)

    async def on_node_notice(self, msg: protocol.NodeNotice):
        # The node's own credential is the check: an agent gives notice for its node only.
        await self.write(
            lambda: gpu_health.give_notice(
                Node.objects.get(pk=self.node_id), msg.in_s, msg.source, msg.reason
            )
        )

    async def on_logs_reply(self, msg: protocol.LogsReply):
        reply_channel = self.logs_waiting.pop(msg.request_id, None)
        if reply_channel is None:
            return  # the asker gave up long ago
        # What a revoked node says reaches no one, operators included.
        await self.write(lambda: None)
        try:
            await self.channel_layer.send(
                reply_channel,
                {"type": "logs.reply", "request_id": msg.request_id, "reply": msg.model_dump()},
            )
        except ChannelFull:
            # The asker's process is not reading (busy, or gone without its
            # channel expiring yet): it will time out as for an agent that never
            # answered. Not a reason to end this socket.
            AGENT_LOGS_REPLIES_DROPPED.inc()
            logger.warning(
                "log reply dropped, the asker's channel is over capacity node=%s request_id=%s",
                self.node_id,
                msg.request_id,
            )

    async def on_ack(self, msg: protocol.AgentAck):
        if msg.of == "desired":
            if msg.version <= self.acked_version:
                # Acked no further than the registration wrote: the write would change
                # nothing (acks only move forward). After a restart every agent acks the
                # set it was sent with its register's ack: a thousand writes saved.
                return
            await self.write(inventory.apply_desired_ack, self.node_id, msg.version)
        elif msg.of == "remove_weights":
            await self.write(delivery.record_reply, self.node_id, msg)

    async def on_goodbye(self, msg: protocol.Goodbye):
        logger.info("agent said goodbye node=%s reason=%s", self.node_id, msg.reason)
        self.closing = True
        await self.close(code=int(CloseCode.NORMAL))

    # ---- control plane -> agent ------------------------------------------------

    async def send_msg(self, msg) -> None:
        await self.send(text_data=protocol.dump(msg))

    async def send_desired(self) -> None:
        await self.send_msg(await socket_db.call(desired.desired_set, self.node_id))

    # ---- the socket's end -----------------------------------------------------------

    async def __call__(self, scope, receive, send):
        # Channels calls disconnect() when the socket closes under a running
        # consumer. A channel-layer error (Redis gone) ends the consumer with
        # an exception instead, and Daphne closes the socket with 1011: the
        # node must be let go all the same, then the error goes on as before.
        try:
            await super().__call__(scope, receive, send)
        except Exception as exc:
            # An OSError here is the client gone while we answered it (uvicorn's
            # ClientDisconnected: an agent that gave up on a slow handshake).
            logger.log(
                logging.INFO if isinstance(exc, OSError) else logging.WARNING,
                "agent socket ended by an error node=%s client=%s error=%r",
                self.node_id or "-",
                getattr(self, "client", "?"),
                exc,
            )
            await self.release(1011)
            raise

    async def disconnect(self, code):
        await self.release(code)

    async def release(self, code) -> None:
        """What a closed socket leaves behind: its deadline, its group, the node's
        connected mark. Once per socket, however it ended."""
        if self.released:
            return
        self.released = True
        self.through(registered=False)
        if self.identity is not None:
            logger.info(
                "agent socket ended code=%s node=%s client=%s",
                code,
                self.node_id or "-",
                getattr(self, "client", "?"),
            )
        deadline = getattr(self, "register_deadline", None)
        if deadline is not None:
            deadline.cancel()
        if self.node_id is None:
            return
        heartbeat.detach()
        try:
            await groups.leave(self.channel_layer, self.group, self.channel_name)
        except Exception:  # noqa: BLE001 - Redis away: the entry expires with the group's expiry
            logger.warning("could not leave the node's group node=%s", self.node_id)
        # With the other sockets closing meanwhile (a web process stopping closes
        # them all), in one transaction.
        held = await socket_db.node_batcher(
            "disconnects", inventory.mark_disconnected_many, DISCONNECTS_MAX_BATCH
        ).submit(inventory.Disconnect(self.node_id, self.channel_name))
        if held:
            logger.info("agent stream closed node=%s code=%s", self.node_id, code)
