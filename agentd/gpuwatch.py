"""The driver's critical GPU events, and harmful clock slowdowns, told as they happen.

A thread of its own waits in NVML's event API (``EventWatcher.wait``): the
wait blocks in the driver, which a heartbeat must never do, and ctypes lets
go of the GIL while it does. The moment an XID or a double-bit ECC error
arrives it goes to the control plane as one ``gpu_events`` message rather
than with the next heartbeat: a GPU fallen off the bus is worth seconds.

The same thread reads each GPU's harmful clock slowdowns every
``poll_s`` and tells only the GPUs whose set changed (an empty set: that
GPU's slowdown ended). After a registration, ``resend()`` has it tell every
GPU's, since the control plane's may be stale (an agent restarted while a
slowdown ended). Faults need no resend: the control plane keeps them until
an operator clears them, and the driver delivers each event once.

Messages go out through ``send``, which must be safe to call from this
thread (the agent's ``send_threadsafe``). A burst (an engine looping on
XID 13) is bounded: the first event of a quiet spell goes at once, and
after it at most one message per ``MIN_GAP_S`` carries what came meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pynvml

from agentd import protocol, xid
from agentd.nvml import NVML, EventWatcher
from agentd.outbox import MAX_EVENTS

logger = logging.getLogger(__name__)

SLOWDOWN_POLL_S = 5.0
# The longest one wait in the driver lasts: how soon close() and resend() are seen.
WAIT_CAP_S = 0.5
# At most one gpu_events message this often in a burst: the control plane takes
# 20 messages a second from a node (docs/protocol.md, Limits).
MIN_GAP_S = 0.25
# After an NVML error that is not a timeout (a lost GPU), before waiting again.
ERROR_BACKOFF_S = 1.0


def describe(event: xid.GPUEvent) -> str:
    """One event in words: "XID 79 (GPU has fallen off the bus): fail"."""
    action, _reason = xid.event_finding(event)
    if event.kind == xid.XID_EVENT and event.xid is not None:
        return f"XID {event.xid} ({xid.lookup(event.xid).meaning}): {action}"
    if event.kind == xid.DOUBLE_BIT_ECC_EVENT:
        return f"double bit ECC error: {action}"
    return f"event {event.kind}: {action}"


def report(events: list[xid.GPUEvent]) -> list[protocol.GPUEventReport]:
    """The events as the protocol carries them; one naming no GPU this agent watches
    (the driver's, not ours) cannot be told and is logged instead."""
    out = []
    for e in events:
        if e.index is None:
            logger.warning("NVML event for a GPU not watched uuid=%s: %s", e.uuid, describe(e))
            continue
        out.append(protocol.GPUEventReport(gpu_index=e.index, kind=e.kind[:32], xid=e.xid))
    return out


class GPUWatch:
    """One thread: the driver's events as they come, slowdowns every ``poll_s``."""

    def __init__(
        self,
        session: NVML,
        send: Callable[[protocol.GPUEvents], None],
        poll_s: float = SLOWDOWN_POLL_S,
    ):
        self.session = session
        self.send = send
        self.poll_s = poll_s
        self.watcher: EventWatcher | None = None
        self._told: dict[int, list[str]] = {}  # slowdowns by GPU index, as last sent
        self._stop = threading.Event()
        self._resend = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = ""
        self._pending: list[xid.GPUEvent] = []  # delivered, not yet handed to send

    def start(self) -> None:
        """Register for the events (blocking: NVML) and start the thread."""
        self.watcher = self.session.watch()
        logger.info(
            "watching NVML events on %d of %d GPU(s); slowdowns every %g s",
            len(self.watcher.registered),
            len(self.session.devices),
            self.poll_s,
        )
        self._thread = threading.Thread(target=self._run, name="gpu-events", daemon=True)
        self._thread.start()

    def resend(self) -> None:
        """Tell every GPU's slowdowns at the next turn (after a registration)."""
        self._resend.set()

    def close(self) -> None:
        """Stop the thread, then free the event set (blocking: up to one wait)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(WAIT_CAP_S * 4)
            if self._thread.is_alive():
                # Stuck in the driver: freeing the set under it would be worse.
                logger.warning("the GPU event thread did not stop; leaving its event set")
                return
        if self.watcher is not None:
            self.watcher.close()

    # ---- the thread --------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._loop()
            except Exception as exc:  # noqa: BLE001 - a bug here must not end the watching
                if str(exc) != self._last_error:
                    logger.exception("the GPU event thread failed; starting it over")
                    self._last_error = str(exc)
                self._stop.wait(ERROR_BACKOFF_S)

    def _loop(self) -> None:
        """Until close(); an exception ends it, and _run starts it over."""
        pending = self._pending
        next_poll = 0.0  # at once: the slowdowns as they are now
        last_sent = float("-inf")
        while not self._stop.is_set():
            now = time.monotonic()
            if self._resend.is_set() or now >= next_poll:
                everything = self._resend.is_set()
                self._resend.clear()
                self._slowdowns(everything)
                next_poll = now + self.poll_s
            until = next_poll
            if pending:
                until = min(until, last_sent + MIN_GAP_S)
            timeout = min(max(0.0, until - now), WAIT_CAP_S)
            try:
                got = self.watcher.wait(int(timeout * 1000))
            except pynvml.NVMLError as exc:
                self._error(exc)
                self._stop.wait(ERROR_BACKOFF_S)
                continue
            if self._last_error:
                logger.info("NVML events are readable again")
                self._last_error = ""
            for e in got:
                action, _ = xid.event_finding(e)
                level = logging.INFO if action is xid.Action.WATCH else logging.WARNING
                logger.log(level, "GPU %s: %s", "?" if e.index is None else e.index, describe(e))
            pending += got
            if pending and time.monotonic() >= last_sent + MIN_GAP_S:
                events = report(pending[:MAX_EVENTS])
                del pending[:MAX_EVENTS]
                if events:
                    self.send(protocol.GPUEvents(type="gpu_events", events=events))
                    last_sent = time.monotonic()

    def _error(self, exc: pynvml.NVMLError) -> None:
        text = str(exc)
        if text != self._last_error:  # once per new error, not once a second
            logger.warning("waiting for NVML events failed: %s; trying again", text)
            self._last_error = text

    def _slowdowns(self, everything: bool) -> None:
        now = self.session.slowdowns()
        changed = []
        for index, reasons in sorted(now.items()):
            if not everything and reasons == self._told.get(index, []):
                continue
            if reasons != self._told.get(index, []):
                if reasons:
                    logger.warning("GPU %d clocks slowed: %s", index, ", ".join(reasons))
                else:
                    logger.info("GPU %d clocks no longer slowed", index)
            changed.append(protocol.GPUSlowdown(gpu_index=index, reasons=reasons))
            self._told[index] = reasons
        for i in range(0, len(changed), 64):  # protocol.GPUEvents.slowdowns' bound
            self.send(protocol.GPUEvents(type="gpu_events", slowdowns=changed[i : i + 64]))
