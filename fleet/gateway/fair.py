"""Fair share when a model's replicas are all busy (docs/gateway.md, "Fair share").

With ``LLMGW_GATEWAY_FAIR_QUEUE`` above 0, a request that finds every replica
of its model at ``LLMGW_GATEWAY_MAX_OUTSTANDING_PER_REPLICA`` waits in this
process for a slot instead of a 429, as does one whose key is at its own
``max_concurrent``. Each request that ends frees a slot, and the next waiter is
taken in weighted fair order across keys, not arrival order: every key has a
virtual clock that advances by 1/``share_weight`` per request it is given, and
the key whose clock is furthest behind goes next (a key that starts waiting
starts at the queue's present, so an idle spell earns no credit). A key
sending ten times the traffic of another therefore waits behind its own
requests, and the light key's wait is about one request's, whatever the heavy
one sends. ``LLMGW_GATEWAY_FAIR_SHARE=false`` takes them in arrival order
instead (for comparison: docs/benchmarks.md).

A first attempt passes ``admit``: there is room on its replica and for its key,
or it waits here, or it is a 429 when the gateway holds no queue; a retry only
checks the replica (``check_capacity``). A batch's line never takes a turn in
the queue: it waits behind every interactive request for what they leave
(``batch_room``, ``batch_refusal``).

Per process, per model: nothing is shared between gateway processes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field

from . import table
from .choice import choose
from .errors import GatewayError


@dataclass
class _Waiter:
    future: asyncio.Future
    key_id: int
    seq: int  # arrival order, for first come first served
    handed: bool = False  # woken with a slot, not yet back on its way (Queue.handed)


@dataclass
class Queue:
    """One model's waiters in one process."""

    fair: bool = True
    by_key: dict[int, deque[_Waiter]] = field(default_factory=dict)
    clock: dict[int, float] = field(default_factory=dict)  # each key's virtual time
    now: float = 0.0  # the virtual time of the last request given a slot
    size: int = 0
    # Waiters woken with a slot that have not run yet: the slot is theirs, though the
    # replica's count does not show it until they run (a batch line must not take it).
    handed: int = 0

    def join(self, key_id: int, seq: int, again: bool = False) -> _Waiter:
        """``again``: woken, but the slot was taken first; it keeps its place."""
        waiter = _Waiter(asyncio.get_running_loop().create_future(), key_id, seq)
        q = self.by_key.setdefault(key_id, deque())
        if not q and not again:
            self.clock[key_id] = max(self.clock.get(key_id, 0.0), self.now)
        if again:
            q.appendleft(waiter)
        else:
            q.append(waiter)
        self.size += 1
        return waiter

    def leave(self, waiter: _Waiter) -> None:
        """A waiter that gave up (its timeout, its client gone)."""
        q = self.by_key.get(waiter.key_id)
        if q and waiter in q:
            q.remove(waiter)
            self.size -= 1
            if not q:
                del self.by_key[waiter.key_id]

    def next_key(self, eligible) -> int | None:
        """The key whose waiter goes next, among keys ``eligible(key_id)`` allows."""
        keys = [k for k, q in self.by_key.items() if q and eligible(k)]
        if not keys:
            return None
        if self.fair:
            return min(keys, key=lambda k: (self.clock[k], self.by_key[k][0].seq))
        return min(keys, key=lambda k: self.by_key[k][0].seq)

    def wake(self, key_id: int, weight: float) -> None:
        q = self.by_key[key_id]
        waiter = q.popleft()
        self.size -= 1
        if not q:
            del self.by_key[key_id]
        self.now = self.clock[key_id]
        self.clock[key_id] += 1.0 / weight
        if not waiter.future.done():
            waiter.future.set_result(None)
            waiter.handed = True
            self.handed += 1


class FairShare:
    """Every model's queue in this process, and each key's requests in flight."""

    def __init__(self, size: int, fair: bool, timeout_s: float):
        self.size, self.fair, self.timeout_s = size, fair, timeout_s
        self.queues: dict[str, Queue] = {}
        # Batch lines waiting for room, by model: set (and dropped) when a request of
        # the model ends, so they look again (``batch_room``).
        self.batch_room: dict[str, asyncio.Event] = {}
        self.in_flight: dict[int, int] = {}  # by key id
        self.weights: dict[int, float] = {}
        self.limits: dict[int, int] = {}  # a key's max_concurrent (0: none)
        self._seq = itertools.count()

    def key_full(self, key) -> bool:
        return bool(key.max_concurrent) and self.in_flight.get(key.id, 0) >= key.max_concurrent

    async def wait(self, route_name: str, key, why: str, again: bool = False) -> None:
        """Wait for a slot; GatewayError past the queue's size or the wait bound."""
        queue = self.queues.setdefault(route_name, Queue(fair=self.fair))
        if queue.size >= self.size and not again:
            raise GatewayError(
                429,
                f"model '{route_name}' is at capacity ({why}) and {queue.size} requests "
                "are waiting in this gateway already",
                code="model_at_capacity",
                retry_after=1,
            )
        self.weights[key.id] = float(key.share_weight or 1)
        self.limits[key.id] = key.max_concurrent or 0
        waiter = queue.join(key.id, next(self._seq), again)
        try:
            async with asyncio.timeout(self.timeout_s):
                await waiter.future
        except TimeoutError:
            queue.leave(waiter)
            raise GatewayError(
                429,
                f"model '{route_name}' stayed at capacity ({why}) for {self.timeout_s:g} s",
                code="model_at_capacity",
                retry_after=1,
            ) from None
        except asyncio.CancelledError:
            queue.leave(waiter)
            raise
        finally:
            if waiter.handed:
                queue.handed -= 1

    def started(self, key) -> None:
        if key is not None:
            self.in_flight[key.id] = self.in_flight.get(key.id, 0) + 1

    def ended(self, route_name: str, key) -> None:
        """A request of ``key`` ended: its slot goes to the next waiter, fairly."""
        if key is not None:
            left = self.in_flight.get(key.id, 1) - 1
            if left:
                self.in_flight[key.id] = left
            else:
                self.in_flight.pop(key.id, None)
        limits = self.limits

        def eligible(key_id: int) -> bool:
            cap = limits.get(key_id, 0)
            return not cap or self.in_flight.get(key_id, 0) < cap

        queue = self.queues.get(route_name)
        key_id = queue.next_key(eligible) if queue and queue.size else None
        if key_id is not None:
            queue.wake(key_id, self.weights.get(key_id, 1.0))
        if key is not None and key.max_concurrent:
            # The key is under its own bound again: a waiter of it on another model
            # may go (it checks that model's replicas again when woken).
            for name, other in self.queues.items():
                if name != route_name and other.by_key.get(key.id) and eligible(key.id):
                    other.wake(key.id, self.weights.get(key.id, 1.0))
                    break
        room = self.batch_room.pop(route_name, None)
        if room is not None:
            # Last: an interactive waiter woken above runs first and takes the room.
            room.set()


async def admit(gw, route: table.Route, up: table.Upstream, key, at) -> table.Upstream | None:
    """The replica a first attempt goes to once there is room: on it (under
    ``max_outstanding``) and for the key (under its ``max_concurrent``). Without room,
    the request waits its turn in fair order (``FairShare.wait``), or is answered
    429 when the gateway holds no queue."""
    limits, again = gw.limits, False
    if key is not None and key.batch:
        return await batch_room(gw, route, up, key, at)
    while True:
        full = up.outstanding >= limits.max_outstanding
        key_full = key is not None and gw.fair.key_full(key)
        if not full and not key_full:
            return up
        if key is None or not gw.fair.size:
            check_capacity(route, up, limits)  # no queue: the 429 at once
            raise GatewayError(
                429,
                f"API key '{key.name}' has {key.max_concurrent} requests in flight, its most",
                code="too_many_in_flight",
                retry_after=1,
            )
        why = (
            f"{len(route.upstreams)} replica(s) with {limits.max_outstanding} requests in "
            "flight each"
            if full
            else f"API key '{key.name}' has {key.max_concurrent} requests in flight, its most"
        )
        await gw.fair.wait(route.name, key, why, again)
        again = True
        up, _ = choose(gw, route, at, [])
        if up is None:
            return None


# A batch's line waiting for room looks again at least this often: an engine's queue
# (its /metrics) empties without a request of this process ending.
BATCH_LOOK_S = 0.25


async def batch_room(gw, route: table.Route, up: table.Upstream, key, at) -> table.Upstream:
    """The replica a batch's line goes to, once one has room for it (``batch_refusal``).

    It waits in this process behind every interactive request, looking again each
    time a request of its model ends (``FairShare.ended``), for at most
    ``LLMGW_GATEWAY_FAIR_WAIT_S``; then the 429 that sends it back to its worker,
    which sends it again later. Waiting here rather than bouncing starts the line
    the moment there is room, without a worker's round trip per refusal."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + gw.fair.timeout_s
    while True:
        why = batch_refusal(gw, route, up)
        if not why and gw.fair.key_full(key):
            why = f"API key '{key.name}' has {key.max_concurrent} requests in flight"
        if not why:
            return up
        left = deadline - loop.time()
        if left <= 0:
            raise GatewayError(
                429,
                f"model '{route.name}' is busy ({why}): a batch line waits for room",
                code="model_at_capacity",
                retry_after=1,
            )
        room = gw.fair.batch_room.setdefault(route.name, asyncio.Event())
        try:
            await asyncio.wait_for(room.wait(), min(left, BATCH_LOOK_S))
        except TimeoutError:
            pass
        up, _ = choose(gw, route, at, [])
        if up is None:
            raise GatewayError(
                503, route.unavailable or f"model '{route.name}' has no ready replica",
                code="no_ready_replica", retry_after=route.retry_after,
            )  # fmt: skip


def batch_refusal(gw, route: table.Route, up: table.Upstream) -> str:
    """Why a batch's line may not start on ``up`` now ("" when it may). Batch lines take
    only what interactive requests leave: never a turn in the fair queue, none while an
    interactive request of the model waits there, none on a replica at its bound or
    whose engine already queues requests of its own (``engine_waiting``). An engine
    whose queue cannot be seen (no /metrics: llama-cpp-python's server, which answers
    one request at a time) gets one line at a time, so an interactive request that
    arrives waits behind one line at most, not a batch's worth."""
    queue = gw.fair.queues.get(route.name)
    if queue is not None and (queue.size or queue.handed):
        return f"{queue.size + queue.handed} interactive request(s) waiting"
    if up.outstanding >= gw.limits.max_outstanding:
        return f"its replicas have {gw.limits.max_outstanding} requests in flight each"
    if up.engine_waiting:
        return f"its engine queues {up.engine_waiting:g} request(s)"
    if up.engine_waiting is None and up.batch_outstanding:
        return "its engine's queue cannot be seen, and it has a batch line already"
    return ""


def check_capacity(route: table.Route, up: table.Upstream, limits) -> None:
    """The 429 when even the least busy replica has ``max_outstanding`` requests in flight."""
    if up.outstanding >= limits.max_outstanding:
        raise GatewayError(
            429,
            f"model '{route.name}' is at capacity: {len(route.upstreams)} "
            f"replica(s) with {limits.max_outstanding} requests in flight each",
            code="model_at_capacity",
            retry_after=1,
        )
