"""Sockets joining and leaving channel-layer groups, in pipelined batches.

channels_redis sends each ``group_add`` (ZADD, EXPIRE) and ``group_discard``
(ZREM) on a pool connection of its own: when a web process stops, its thousands
of agent sockets all leave their nodes' groups at once, each waiting for a fresh
connection to Redis and its round trips. With 5,000 agents that took seconds of
the stop, and some leaves failed outright (docs/benchmarks.md, "Where the
restart's time went"); a failed leave stays in the group until the group's
expiry (a day), and every ring to that node is sent to the dead channel too.

Here the joins and leaves an event loop's sockets ask for meanwhile go to Redis
together, one pipeline per Redis host, in the order they were asked for (a
socket's join is always before its leave). A lone one waits for nothing.
Layers other than channels_redis's get the plain calls.
"""

from __future__ import annotations

import asyncio
import time
import weakref

# Joins and leaves in one batch (a join is two commands): a few hundred kilobytes
# for Redis to answer at most.
MAX_BATCH = 2000


class Groups:
    """One event loop's joins and leaves for one channels_redis layer."""

    def __init__(self, layer):
        self.layer = layer
        self.pending: list[tuple[str, str, str, asyncio.Future]] = []
        self.task: asyncio.Task | None = None

    async def submit(self, op: str, group: str, channel: str) -> None:
        """Join ("add") or leave ("discard"); raises what Redis raised for the batch.

        A bad name fails here, alone, as the layer's own calls fail it (TypeError)."""
        self.layer.require_valid_group_name(group)
        self.layer.require_valid_channel_name(channel)
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((op, group, channel, fut))
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._drain())
        await fut

    async def _drain(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
                try:
                    await self._write(batch)
                except BaseException:
                    # The process is stopping: nobody waits for long, and nothing
                    # left would be written in order after this batch anyway.
                    for *_, fut in batch + self.pending:
                        fut.cancel()
                    self.pending = []
                    raise
        finally:
            self.task = None  # the finished task would hold its loop

    async def _write(self, batch) -> None:
        """The batch, one pipeline per Redis host, all of them finished before the next
        batch (so a host that answers late cannot see a leave before its join). Each
        waiter hears how its own host's pipeline went."""
        layer = self.layer
        by_host: dict[int, list] = {}
        now = time.time()
        for entry in batch:
            by_host.setdefault(layer.consistent_hash(entry[1]), []).append(entry)
        hosts = list(by_host)
        results = await asyncio.gather(
            *(self._pipeline(index, by_host[index], now) for index in hosts),
            return_exceptions=True,
        )
        for index, result in zip(hosts, results, strict=True):
            for *_, fut in by_host[index]:
                if fut.done():
                    continue
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(None)

    async def _pipeline(self, index: int, entries, now: float) -> None:
        layer = self.layer
        pipe = layer.connection(index).pipeline(transaction=False)
        for op, group, channel, _ in entries:
            key = group_key(layer, group)
            if op == "add":
                pipe.zadd(key, {channel: now})
                pipe.expire(key, layer.group_expiry)
            else:
                pipe.zrem(key, channel)
        await pipe.execute()


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Groups] = weakref.WeakKeyDictionary()


def group_key(layer, group: str) -> bytes:
    """The Redis key of ``group``'s sorted set, as channels_redis 4.x names it.

    The layer's own function for it is private. In tests/core/test_groups.py the
    layer's ``group_send`` rings sockets joined here, so a release that names the
    key otherwise fails there, not in production."""
    return f"{layer.prefix}:group:{group}".encode()


def _batched(layer) -> bool:
    return all(hasattr(layer, name) for name in ("prefix", "consistent_hash", "connection"))


def _groups(layer) -> Groups:
    loop = asyncio.get_running_loop()
    mine = _by_loop.get(loop)
    if mine is None or mine.layer is not layer:
        mine = _by_loop[loop] = Groups(layer)
    return mine


async def join(layer, group: str, channel: str) -> None:
    """``layer.group_add(group, channel)``, batched with the loop's other joins and leaves."""
    if not _batched(layer):
        await layer.group_add(group, channel)
        return
    await _groups(layer).submit("add", group, channel)


async def leave(layer, group: str, channel: str) -> None:
    """``layer.group_discard(group, channel)``, batched likewise."""
    if not _batched(layer):
        await layer.group_discard(group, channel)
        return
    await _groups(layer).submit("discard", group, channel)
