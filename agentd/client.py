"""The agent's one socket to the control plane, kept open for the agent's lifetime.

Register first, always; then heartbeats on the interval the control plane's
ack names, everything queued in the agent's outbox, and whatever the control
plane sends handed to the agent. A lost connection is retried with jittered
exponential backoff; only a refusal of who this node is (4003, 4010, or HTTP
403 at the handshake) stops the agent, since retrying cannot fix it.

With more than one control-plane URL (``control_plane_urls``: web processes of one
control plane), each retry goes to the next URL in turn, so an agent whose web
process died is back on another after the first, short, backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl

import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agentd import protocol
from agentd.agent import Agent
from agentd.protocol import CloseCode

logger = logging.getLogger(__name__)

REGISTER_ACK_TIMEOUT_S = 15
GOODBYE_TIMEOUT_S = 7
# Discovery stuck this long (a hung NFS mount) is retried on the next connection.
REGISTER_COLLECT_TIMEOUT_S = 60
# A heartbeat asked for at once (a shard gave GPU memory back) waits at least this
# long after the one before: a burst of stops is one or two heartbeats, not dozens.
BEAT_SOON_GAP_S = 0.25
FATAL_CLOSE = {CloseCode.FORBIDDEN, CloseCode.REVOKED}


class Refused(Exception):
    """The control plane will not accept this node as it is. Retrying cannot help."""


class Backoff:
    """1 s doubling to 30 s, each wait drawn from its upper half.

    The jitter spreads a fleet that lost its control plane at the same moment,
    so a thousand agents do not all knock again on the same second.
    """

    def __init__(
        self,
        first: float = 1.0,
        cap: float = protocol.RECONNECT_BACKOFF_CAP_S,
        rng: random.Random | None = None,
    ):
        self.first, self.cap = first, cap
        self.rng = rng or random.Random()
        self.attempt = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.first * 2**self.attempt)
        self.attempt += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0

    def wait_after(self, exc: BaseException | None) -> float:
        """The wait before the next attempt after ``exc``: what the control plane asked
        for when it turned the handshake away busy (503, Retry-After), plus up to a
        second of jitter, at most the cap; else the next step of the backoff."""
        asked = retry_after_s(exc)
        if asked is not None:
            return min(self.cap, asked + self.rng.uniform(0, 1))
        return self.next()


def retry_after_s(exc: BaseException | None) -> float | None:
    """Seconds a 503 at the handshake asked this agent to wait (Retry-After), or None.

    The control plane sends one when more agents knock than it takes at once
    (after a restart, the whole fleet): coming back then, rather than on the
    backoff, spreads the fleet over what it can take.
    """
    if not isinstance(exc, InvalidStatus) or exc.response.status_code != 503:
        return None
    try:
        value = float(exc.response.headers.get("Retry-After", ""))
    except ValueError:
        return None  # absent, or an HTTP date (llmgw sends seconds): the backoff
    return value if 0 <= value < float("inf") else None


def _tls(agent: Agent) -> ssl.SSLContext | None:
    """The TLS context for a wss:// control plane: its CA, and this node's certificate if any.

    Read on every connection, so a certificate renewed on disk is presented at
    the next reconnect without restarting the agent.
    """
    cfg = agent.cfg
    if not cfg.control_plane_url.startswith("wss://"):  # every URL has its scheme
        return None
    ctx = ssl.create_default_context(cafile=str(cfg.tls_ca_file) if cfg.tls_ca_file else None)
    if cfg.tls_cert_file is not None:
        key = str(cfg.tls_key_file) if cfg.tls_key_file else None
        ctx.load_cert_chain(str(cfg.tls_cert_file), key)
    return ctx


async def run(agent: Agent, stop: asyncio.Event, backoff: Backoff | None = None) -> None:
    """Connect, serve, reconnect, until ``stop`` is set. Raises Refused when refused."""
    backoff = backoff or Backoff()
    urls = agent.cfg.urls
    turn = 0
    while not stop.is_set():
        url = urls[turn % len(urls)]
        turn += 1
        failure: BaseException | None = None
        try:
            registered = asyncio.Event()
            session = _session(agent, url, stop, backoff, registered)
            await _until_stopped(session, stop, registered)
        except Refused:
            raise
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise Refused(
                    f"the control plane at {url} refused this node's "
                    f"{'credential' if agent.cfg.read_credential() else 'join token'} "
                    f"(HTTP {status}): it is unknown, expired, used up or revoked"
                ) from None
            failure = exc
            asked = retry_after_s(exc)
            if asked is not None:
                logger.warning(
                    "control plane at %s is busy and asks to come back in %g s", url, asked
                )
            else:
                logger.warning("control plane at %s answered HTTP %d; retrying", url, status)
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else None
            reason = exc.rcvd.reason if exc.rcvd else ""
            if code in FATAL_CLOSE:
                raise Refused(
                    f"the control plane closed the socket with {code} ({reason or 'no reason'})"
                ) from None
            if not stop.is_set():
                logger.warning(
                    "connection to the control plane closed code=%s reason=%s", code, reason or "-"
                )
        except (TimeoutError, OSError, websockets.InvalidHandshake, protocol.ProtocolError) as exc:
            logger.warning(
                "cannot reach the control plane at %s: %s", url, exc or type(exc).__name__
            )
        except Exception:  # noqa: BLE001 - a bug here must not end the agent: engines need it
            logger.exception("the connection to the control plane failed")
        if stop.is_set():
            return
        delay = backoff.wait_after(failure)
        if len(urls) > 1:
            logger.info("reconnecting in %.1f s to %s", delay, urls[turn % len(urls)])
        else:
            logger.info("reconnecting in %.1f s", delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)


async def _until_stopped(session, stop: asyncio.Event, registered: asyncio.Event) -> None:
    """Run a session until it ends or stop is set. A registered session gets a few seconds
    to say goodbye; one still connecting is cancelled at once (a SIGTERM must not wait
    out the timeout of a control plane that does not answer)."""
    task = asyncio.ensure_future(session)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and registered.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), GOODBYE_TIMEOUT_S)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if not task.cancelled():
        task.result()


async def _session(
    agent: Agent, url: str, stop: asyncio.Event, backoff: Backoff, registered: asyncio.Event
) -> None:
    cfg = agent.cfg
    async with websockets.connect(
        url,
        additional_headers={"Authorization": f"Bearer {cfg.bearer()}"},
        ssl=_tls(agent),
        open_timeout=10,
        ping_interval=20,
        ping_timeout=20,
        close_timeout=5,
        max_size=2**20,
        user_agent_header=f"llmgw-agent/{agent.version}",
    ) as ws:
        local = ws.local_address[0] if ws.local_address else ""
        register = await asyncio.wait_for(
            asyncio.to_thread(agent.register_message, local, agent.shard_facts()),
            REGISTER_COLLECT_TIMEOUT_S,
        )
        await ws.send(protocol.dump(register))
        ack = await asyncio.wait_for(_register_ack(ws), REGISTER_ACK_TIMEOUT_S)
        if ack.credential:
            agent.store_credential(ack.credential)
        backoff.reset()
        registered.set()
        agent.on_registered()
        # The control plane's interval when it names one, else agent.yaml's.
        if "heartbeat_interval_s" in ack.model_fields_set:
            interval = ack.heartbeat_interval_s
        else:
            interval = cfg.heartbeat_interval_s
        logger.info(
            "registered node=%s gpus=%d running_shards=%d heartbeat=%gs via=%s",
            register.node_id,
            len(register.gpus),
            len(register.running_shards),
            interval,
            url,
        )
        tasks = [
            asyncio.ensure_future(_receive(agent, ws)),
            asyncio.ensure_future(_heartbeats(agent, ws, interval)),
            asyncio.ensure_future(_send_outbox(agent, ws)),
            asyncio.ensure_future(stop.wait()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            if t.exception() is not None:
                raise t.exception()
        if not stop.is_set():
            # The receive loop ended on a clean close (1000/1001): the server is going away.
            logger.warning(
                "the control plane closed the connection code=%s reason=%s",
                ws.close_code,
                ws.close_reason or "-",
            )
        else:
            # Leaving on purpose. The engines keep running: they outlive the agent.
            with contextlib.suppress(ConnectionClosed):
                await ws.send(
                    protocol.dump(protocol.Goodbye(type="goodbye", reason="agent stopping"))
                )
            await ws.close(code=CloseCode.NORMAL, reason="agent stopping")
            logger.info("said goodbye to the control plane")


async def _register_ack(ws) -> protocol.ServerAck:
    while True:
        msg = protocol.parse_control_message(await ws.recv())
        if msg.type == "ack" and msg.of == "register":
            return msg
        if msg.type == "closing":
            _closing(msg)
        else:
            logger.debug("before the register ack: %s (dropped)", msg.type)


def _closing(msg: protocol.Closing) -> None:
    # The reason travels only in this message (Daphne drops the close frame's).
    logger.warning("the control plane is closing the socket code=%d: %s", msg.code, msg.reason)


async def _receive(agent: Agent, ws) -> None:
    async for raw in ws:
        try:
            msg = protocol.parse_control_message(raw)
        except protocol.ProtocolError as exc:
            # The control plane is newer or broken; closing would only loop.
            logger.error("unreadable message from the control plane: %s", exc.reason)
            continue
        if msg.type == "closing":
            _closing(msg)
            continue
        await agent.handle(msg)


async def _heartbeats(agent: Agent, ws, interval: float) -> None:
    # Sent directly rather than queued: a heartbeat is about now, and one
    # held over a reconnect would only tell the control plane stale news.
    # Every interval, and at once (at most every BEAT_SOON_GAP_S) when a shard
    # gave its GPU memory back (Agent.beat_soon).
    collecting: asyncio.Future | None = None
    loop = asyncio.get_running_loop()
    sent_at = loop.time()
    agent.beat_soon.clear()
    while True:
        try:
            await asyncio.wait_for(agent.beat_soon.wait(), timeout=interval)
        except TimeoutError:
            pass
        else:
            await asyncio.sleep(max(0.0, sent_at + BEAT_SOON_GAP_S - loop.time()))
        agent.beat_soon.clear()
        if collecting is None or collecting.done():
            collecting = asyncio.ensure_future(
                asyncio.to_thread(agent.heartbeat_message, agent.shard_facts())
            )
        try:
            hb = await asyncio.wait_for(asyncio.shield(collecting), timeout=interval)
        except TimeoutError:
            # Still stuck (statvfs on a hung NFS mount, say): say the node is alive
            # anyway, and keep waiting for that one collection rather than piling up more.
            logger.warning(
                "collecting heartbeat facts takes over %g s; sending a bare one", interval
            )
            hb = agent.bare_heartbeat()
        else:
            collecting = None
        await ws.send(protocol.dump(hb))
        sent_at = loop.time()


async def _send_outbox(agent: Agent, ws) -> None:
    outbox = agent.outbox
    while True:
        await agent.outbox_ready.wait()
        while outbox:
            key, msg = outbox.first()
            await ws.send(protocol.dump(msg))
            # Taken off only once sent: what a dropped socket ate goes out on the next.
            outbox.sent(key, msg)
        agent.outbox_ready.clear()
        # Said once per drain, not per message: a burst while disconnected is one line.
        coalesced = outbox.coalesced_news()
        if coalesced:
            logger.info(
                "outbox sent; superseded messages coalesced so far: %s",
                " ".join(f"{kind}={n}" for kind, n in sorted(coalesced.items())),
            )
