"""What the agent has to tell the control plane, held until a socket takes it.

The outbox never drops a message whose loss would change what the control
plane believes, and it stays bounded by the number of shards, not by how long
the socket has been down. It does so by coalescing: a message that a later one
makes redundant is taken out when the later one comes in. The rule, by kind:

- ``shard_status``: the newest status of a shard replaces its earlier unsent
  one, except a ``failed``: a failure (its error, exit code and last output) is
  what the control plane restarts and counts on, and a later "pending" or
  "ready" would hide it. So a failed status stays, and the statuses after it
  coalesce among themselves behind it; a newer failure replaces the older one
  (and anything queued before it) since it says the same, later. At most two
  statuses per shard: its last failure, then its newest state.
- ``fetch_progress``: the newest per shard (progress, not a transition).
- ``ack``: one per kind; for ``desired``, the newest version (the control plane
  moves its acknowledged version forward only, so an older ack says nothing).
  A ``remove_weights`` reply answers one proposal (its ``request_id``) and says
  what was removed and kept: each is kept until sent (the control plane has
  few proposals out to a node at a time; a repeated one replaces its reply).
- ``logs_reply``: the newest ``LOGS_REPLIES_KEPT``. Someone waits at most a few
  seconds for one; an older reply has no reader left.
- ``gpu_events``: merged into one. Every event is news the control plane keeps
  (a fault, an XID count), so the events are joined, oldest first; past the
  message's bound (``MAX_EVENTS``) the oldest events that change nothing (an
  engine's own XIDs, watched only) go first. Slowdowns: the newest per GPU.
  One being sent (``first()`` until ``sent()``) is not merged into, or its
  events would go out twice: at most two are queued.
- ``node_notice``: the newest (it says how far off the deadline is as of now).

What is sent is always a subsequence of what was queued, in the order it was
queued (``gpu_events`` merged, their events in order): a message that replaces
another goes to the back, so the order of different shards' news is kept. Each
message taken out is counted by kind (``coalesced``), and the client logs the
count when it drains the outbox.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Hashable

from agentd import protocol, xid
from agentd.protocol import ShardState

LOGS_REPLIES_KEPT = 4
MAX_EVENTS = 256  # protocol.GPUEvents.events' bound


class Outbox:
    """An ordered queue of messages in which a later message may replace an earlier one."""

    def __init__(self) -> None:
        self._queue: collections.OrderedDict[Hashable, object] = collections.OrderedDict()
        self._logs: collections.deque[Hashable] = collections.deque()
        self._serial = itertools.count()
        self.coalesced: collections.Counter[str] = collections.Counter()
        self._told = 0
        self._events: Hashable | None = None  # the newest gpu_events' key
        self._in_flight: Hashable | None = None  # first()'s, until sent()

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self):
        return iter(list(self._queue.values()))

    def put(self, msg) -> None:
        kind = msg.type
        if kind == "shard_status":
            self._put_status(msg)
        elif kind == "fetch_progress":
            self._replace(("progress", msg.shard_id), msg)
        elif kind == "ack" and msg.of == "remove_weights":
            self._replace(("ack", msg.of, msg.request_id), msg)
        elif kind == "ack":
            queued = self._queue.get(("ack", msg.of))
            if queued is not None and msg.of == "desired" and msg.version < queued.version:
                self.coalesced[kind] += 1  # the newer ack queued already says more
                return
            self._replace(("ack", msg.of), msg)
        elif kind == "logs_reply":
            key = ("logs", next(self._serial))
            self._queue[key] = msg
            self._logs.append(key)
            while len(self._logs) > LOGS_REPLIES_KEPT:
                if self._queue.pop(self._logs.popleft(), None) is not None:
                    self.coalesced[kind] += 1
        elif kind == "gpu_events":
            # Never into the one being sent: its events would go out twice, and the
            # control plane counts each XID it is told.
            queued = self._queue.get(self._events)
            if queued is not None and self._events != self._in_flight:
                msg = merge_gpu_events(queued, msg)
                self._drop(self._events, kind)
            self._events = ("gpu_events", next(self._serial))
            self._queue[self._events] = msg
        else:
            # node_notice, and any new kind: bounded, the newest replaces the older.
            self._replace(("other", kind), msg)

    def _put_status(self, msg) -> None:
        failed, latest = ("status", msg.shard_id, "failed"), ("status", msg.shard_id, "latest")
        if msg.state == ShardState.FAILED:
            self._drop(failed, "shard_status")
            self._drop(latest, "shard_status")
            self._queue[failed] = msg
        else:
            self._replace(latest, msg)

    def _replace(self, key: Hashable, msg) -> None:
        self._drop(key, msg.type)
        self._queue[key] = msg  # at the back: after everything queued before it

    def _drop(self, key: Hashable, kind: str) -> None:
        if self._queue.pop(key, None) is not None:
            self.coalesced[kind] += 1

    def first(self):
        """The oldest message, left in place until ``sent`` says it went out."""
        key = next(iter(self._queue))
        self._in_flight = key
        return key, self._queue[key]

    def sent(self, key: Hashable, msg) -> None:
        """Take a sent message off, unless a newer one replaced it meanwhile."""
        self._in_flight = None
        if self._queue.get(key) is msg:
            del self._queue[key]
            if key in self._logs:
                self._logs.remove(key)

    def coalesced_news(self) -> dict[str, int] | None:
        """The counts by kind if they grew since last asked (for one log line), else None."""
        total = self.coalesced.total()
        if total == self._told:
            return None
        self._told = total
        return dict(self.coalesced)


def merge_gpu_events(older: protocol.GPUEvents, newer: protocol.GPUEvents) -> protocol.GPUEvents:
    """Two unsent ``gpu_events`` as one: every event in order (the oldest watched-only
    ones dropped past the bound), and each GPU's newest slowdowns."""
    events = [*older.events, *newer.events]
    while len(events) > MAX_EVENTS:
        harmless = next((i for i, e in enumerate(events) if _watched_only(e)), 0)
        del events[harmless]
    slowdowns = {s.gpu_index: s for s in older.slowdowns}
    slowdowns.update({s.gpu_index: s for s in newer.slowdowns})
    return protocol.GPUEvents(
        type="gpu_events", events=events, slowdowns=sorted(slowdowns.values(), key=_index)
    )


def _watched_only(report: protocol.GPUEventReport) -> bool:
    event = xid.GPUEvent(report.gpu_index, "", report.kind, report.xid)
    return xid.event_finding(event)[0] is xid.Action.WATCH


def _index(slowdown: protocol.GPUSlowdown) -> int:
    return slowdown.gpu_index
