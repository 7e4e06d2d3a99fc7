"""Where the agents' sockets do their database work: a few threads, each with its connection.

Channels' ``database_sync_to_async`` runs every call of every socket on one
shared thread and opens and closes a database connection around each call
(``CONN_MAX_AGE`` 0). One registration is a dozen round trips; at thousands of
agents coming back after a restart that thread was the whole control plane's
pace, and a new PostgreSQL connection per call (a server process forked each
time) cost more than the queries (docs/benchmarks.md, Agent sockets).

Here a socket's calls go to one of ``agent_db_threads`` threads, each keeping
its own connection while agents are connected: registrations of different
nodes overlap their round trips, and no call opens a connection. A socket
waits for each call before making the next (Channels hands a consumer one
message at a time), so its own writes stay in order. As with the heartbeat
writer: a database error closes that thread's connection (the next call opens
a fresh one); with no agent socket left, or nothing done for a while, the
connections go back.

``NodeBatcher`` gathers what many sockets write alike (registrations, closed
sockets) into one call on those threads, a batch at a time.
"""

import asyncio
import functools
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, close_old_connections, connection

from fleet.conf import fleet_settings
from fleet.services.heartbeat import batching

logger = logging.getLogger(__name__)
# A connection idle this long is checked before use: the database may have
# restarted under it.
CHECK_AFTER_S = 5.0
IDLE_CLOSE_S = 5.0

_lock = threading.Lock()
_threads: list[ThreadPoolExecutor] = []
_turn = itertools.count()
_last_use: dict[int, float] = {}  # thread index -> monotonic time of its last call
_janitor: threading.Thread | None = None


def _threads_wanted() -> int:
    if connection.vendor == "sqlite":
        return 1  # one writer at a time anyway: more threads would only queue on its lock
    return max(1, fleet_settings().agent_db_threads)


def _executors() -> list[ThreadPoolExecutor]:
    global _janitor
    if not _threads:
        with _lock:
            if not _threads:
                _threads.extend(
                    ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llmgw-agent-db-{k}")
                    for k in range(_threads_wanted())
                )
                _janitor = threading.Thread(
                    target=_janitor_loop, name="llmgw-agent-db-idle", daemon=True
                )
                _janitor.start()
    return _threads


class TooLate(Exception):
    """A call waited for its thread past its deadline, and was not made: the agent that
    asked has given up waiting (its own timeout) and will come back."""


def _run(k: int, deadline: float | None, fn, args, kwargs):
    """In thread ``k``: the call, on this thread's connection."""
    if deadline is not None and time.monotonic() > deadline:
        raise TooLate(f"waited past the deadline for {getattr(fn, '__name__', fn)}")
    if time.monotonic() - _last_use.get(k, 0.0) > CHECK_AFTER_S and connection.connection:
        if not connection.is_usable():
            connection.close()
    failed = False
    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        failed = True
        raise
    finally:
        _last_use[k] = time.monotonic()
        if failed or batching.sockets() == 0:
            # Broken, or no agent socket left to make more calls: give it back.
            close_old_connections()


async def call(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` on one of the sockets' database threads."""
    return await call_by(None, fn, *args, **kwargs)


async def call_by(deadline: float | None, fn, *args, **kwargs):
    """As ``call``, unless its turn comes after ``deadline`` (monotonic): then TooLate.

    A fleet reconnecting at once queues more registrations than the threads get
    through while the agents wait; one whose agent has already given up is
    dropped rather than written, so the queue drains at the pace of the live ones.
    """
    executors = _executors()
    k = next(_turn) % len(executors)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        executors[k], functools.partial(_run, k, deadline, fn, args, kwargs)
    )


def _close_if_idle(k: int) -> None:
    if time.monotonic() - _last_use.get(k, 0.0) >= IDLE_CLOSE_S:
        close_old_connections()


def _janitor_loop() -> None:
    while True:
        time.sleep(1.0)
        for k, executor in enumerate(list(_threads)):
            if time.monotonic() - _last_use.get(k, 0.0) >= IDLE_CLOSE_S:
                try:
                    executor.submit(_close_if_idle, k)
                except RuntimeError:
                    return  # the process is exiting: its executors are shut down


class NodeBatcher:
    """Writes of one event loop's sockets, a batch at a time on one of the sockets'
    database threads: while one batch is written, the next gathers. A lone write
    waits for nothing.

    ``write`` takes a list of items (each with a ``node_id``) and returns, per
    node, its result or the exception that item ends with. At most one item per
    node goes in a batch (a node's second waits for the batch holding its first,
    so its writes stay in order), and at most ``max_batch``.
    """

    def __init__(self, write: Callable[[list], dict], max_batch: int, what: str):
        self.write = write
        self.max_batch = max_batch
        self.what = what  # for the log: "registrations", "disconnects"
        self.pending: list[tuple[object, asyncio.Future]] = []
        self.task: asyncio.Task | None = None

    async def submit(self, item):
        """The item's result; raises what ``write`` ended it with."""
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((item, fut))
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._drain())
        return await fut

    def _take(self) -> list[tuple[object, asyncio.Future]]:
        batch, rest, seen = [], [], set()
        for entry in self.pending:
            node_id = entry[0].node_id
            if node_id in seen or len(batch) >= self.max_batch:
                rest.append(entry)
            else:
                seen.add(node_id)
                batch.append(entry)
        self.pending = rest
        return batch

    async def _drain(self) -> None:
        try:
            while self.pending:
                batch = self._take()
                try:
                    results = await call(self.write, [item for item, _ in batch])
                except Exception as exc:  # noqa: BLE001 - every waiter must hear of it
                    logger.exception("writing %d %s failed", len(batch), self.what)
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                except BaseException:
                    for _, fut in batch:
                        fut.cancel()  # the process is stopping: nobody waits for long
                    raise
                for item, fut in batch:
                    if fut.done():
                        continue
                    result = results.get(item.node_id)
                    if result is None:
                        fut.set_exception(RuntimeError(f"no result for node {item.node_id}"))
                    elif isinstance(result, Exception):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
        finally:
            # The finished task would hold its loop, and the loop's batchers it.
            self.task = None


_batchers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = (
    weakref.WeakKeyDictionary()
)


def node_batcher(what: str, write: Callable[[list], dict], max_batch: int) -> NodeBatcher:
    """The current event loop's batcher for ``what``, made with ``write`` on first use."""
    loop = asyncio.get_running_loop()
    mine = _batchers.setdefault(loop, {})
    b = mine.get(what)
    if b is None:
        b = mine[what] = NodeBatcher(write, max_batch, what)
    return b
