"""Coalescing heartbeat writes: group commit on a writer thread of their own.

Each consumer hands its heartbeat to the batcher of its event loop and waits.
A write starts ``heartbeat_flush_s`` (50 ms) after the first heartbeat that
finds the writer idle; heartbeats that arrive meanwhile, or while a write is
running, are written together. So under load a batch grows with the time a
write takes: a thousand agents cost a few queries a write, not a few thousand;
and the 50 ms keep a quiet fleet's heartbeats from each costing a trip to the
writer thread and a statement of their own (about 40 % of the web process's
CPU per heartbeat at 1,000 agents).
GPUStack reached 200 workers only after batching its heartbeat writes; this is
the same idea from the start.

The writer is a thread of its own with its own database connection, so
heartbeats never queue behind a burst of registrations on the consumers'
shared database thread, and the connection stays open while agents are
connected. The ack an agent receives is sent after the write holding its
heartbeat committed.
"""

import asyncio
import logging
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from agentd import protocol
from fleet.conf import fleet_settings

from ..reconciler.ask import request_reconcile_now
from . import apply
from .apply import ReportMemo

logger = logging.getLogger(__name__)

# One writer: batches are applied in order, and one connection does it.
_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmgw-heartbeats")
_async_commit: "weakref.WeakSet" = weakref.WeakSet()
# Agent sockets open in this process. While there are any, heartbeats keep
# coming and the writer keeps its connection: opening one per write (as
# CONN_MAX_AGE=0 would) cost more than the write itself once the writer went
# idle between heartbeats, as it does many times a second at 1,000 agents.
_sockets = 0


def attach() -> None:
    """An agent socket registered: heartbeats will follow."""
    global _sockets
    _sockets += 1


def sockets() -> int:
    """Agent sockets registered in this process and not yet closed."""
    return _sockets


def detach() -> None:
    """An agent socket closed. With none left, the writer gives its connection back."""
    global _sockets
    _sockets = max(0, _sockets - 1)
    if _sockets == 0:
        _writer.submit(close_old_connections)


# A socket whose consumer died without a disconnect never detaches; after this
# long without a write the connection goes back anyway.
IDLE_CLOSE_S = 5.0
_last_write = 0.0
_janitor: threading.Thread | None = None


def _close_if_idle() -> None:
    if time.monotonic() - _last_write >= IDLE_CLOSE_S:
        close_old_connections()


def _janitor_loop() -> None:
    while True:
        time.sleep(1.0)
        if time.monotonic() - _last_write >= IDLE_CLOSE_S:
            try:
                _writer.submit(_close_if_idle)
            except RuntimeError:
                return  # the process is exiting: its executors are shut down


def _start_janitor() -> None:
    global _janitor
    if _janitor is None:
        _janitor = threading.Thread(target=_janitor_loop, name="llmgw-heartbeats-idle", daemon=True)
        _janitor.start()


def _prepare_connection() -> None:
    connection.ensure_connection()
    raw = connection.connection
    if connection.vendor == "postgresql" and raw not in _async_commit:
        # Heartbeats are soft state, repeated every interval: if PostgreSQL
        # crashes in the few hundred ms before the WAL reaches disk, the next
        # heartbeat says it all again. Not waiting for the flush takes a disk
        # sync off every write. Only this writer's own connection is affected.
        with connection.cursor() as cur:
            cur.execute("SET synchronous_commit TO off")
        _async_commit.add(raw)


# PostgreSQL's deadlock_detected and serialization_failure: the transaction was
# rolled back and may simply be run again.
_RETRYABLE_SQLSTATES = {"40P01", "40001"}


def _retryable(exc: DatabaseError) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) in _RETRYABLE_SQLSTATES


class HeartbeatBatcher:
    def __init__(self, linger: float = 0.0):
        self.linger = linger
        self.pending: list[tuple[tuple, asyncio.Future]] = []
        self.task: asyncio.Task | None = None

    async def submit(
        self,
        node_id: str,
        credential_id: int,
        hb: protocol.Heartbeat,
        memo: ReportMemo | None = None,
    ) -> apply.HeartbeatResult:
        fut = asyncio.get_running_loop().create_future()
        news = memo.news(hb) if memo is not None else hb
        freed = memo is not None and memo.freed(hb)
        self.pending.append(((node_id, credential_id, news, timezone.now()), fut))
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._drain())
        result = await fut
        if memo is not None and not result.revoked:
            memo.written(hb)
            if freed:
                # The room is written: a pass now can wake or place there.
                await asyncio.to_thread(request_reconcile_now)
        return result

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending:
            if self.linger > 0:
                await asyncio.sleep(self.linger)
            batch, self.pending = self.pending, []
            try:
                results = await loop.run_in_executor(
                    _writer, self._write, [item for item, _ in batch]
                )
            except Exception as exc:  # noqa: BLE001 - every waiter must hear of it
                logger.exception("writing %d heartbeats failed", len(batch))
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for item, fut in batch:
                if not fut.done():
                    fut.set_result(results[item[0], item[1]])

    def _write(self, items: list) -> dict[tuple[str, int], apply.HeartbeatResult]:
        """In the writer thread: one transaction for the whole batch."""
        global _last_write
        _start_janitor()
        failed = False
        try:
            _prepare_connection()
            try:
                return apply.apply_heartbeats(items)
            except DatabaseError as exc:
                if not _retryable(exc):
                    raise
                # Chosen as a deadlock's victim, or a serialization failure:
                # nothing was written; once more rather than fail every socket.
                logger.warning("writing %d heartbeats: %s; once more", len(items), exc)
                return apply.apply_heartbeats(items)
        except DatabaseError:
            failed = True
            raise
        finally:
            # Broken, or nothing more to write (no socket that will send more):
            # give the connection back as every other database call would.
            _last_write = time.monotonic()
            if failed or (not self.pending and _sockets == 0):
                close_old_connections()


_batchers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HeartbeatBatcher]" = (
    weakref.WeakKeyDictionary()
)


def batcher() -> HeartbeatBatcher:
    loop = asyncio.get_running_loop()
    b = _batchers.get(loop)
    if b is None:
        b = _batchers[loop] = HeartbeatBatcher(fleet_settings().heartbeat_flush_s)
    return b
