"""Which replica of a route in the table (``fleet.gateway.table``) an attempt goes to.

The least busy ready replica (``pick``), or the one the prompt's prefix
sits on (``pick_prefix``, for a model that routes by prefix); with a canary,
a first attempt goes to the canary's side for ``canary_percent`` of requests, the
same side for the same prefix. Replicas tried already for the request, or set aside
after failures, are skipped; those on a suspect node are picked last. Per request,
from memory: nothing here reads the database.
"""

import random
import time

from . import prefix, table

# The endpoints whose prompt prefix.key_of reads.
_PROMPTED = ("chat/completions", "completions")


def ring_key(gw, route: table.Route, req) -> int | None:
    """Where the prompt's prefix sits on the route's ring; None: the route has none."""
    if route.ring is None:
        return None
    if req.endpoint in _PROMPTED:
        return prefix.key_of(req.endpoint, req.body, gw.limits.prefix_chars)
    if req.chat is not None:  # /v1/messages, /v1/responses: the prompt as chat sees it
        return prefix.key_of("chat/completions", req.chat, gw.limits.prefix_chars)
    return None


def canary_side(route: table.Route, at: int | None) -> bool:
    """Whether a request goes to the model's canary: ``canary_percent`` of them, the same
    side for the same prompt prefix (``at``) where the model routes by prefix."""
    draw = at if at is not None else random.getrandbits(32)
    return draw % 100 < route.canary_percent


def choose(gw, route: table.Route, at: int | None, tried) -> tuple[table.Upstream | None, str]:
    """The replica for an attempt, the least busy or by the prompt's prefix (``at``), and
    how the prefix chose it ("": not by prefix), for ``prefix_routed``.

    With a canary, a first attempt goes to the canary's side or the active side by
    its share (the least busy there; a side with no replica left gives way to the
    other); a retry may go to either."""
    if route.canary_percent and not tried:
        side = canary_side(route, at)
        others = [u for u in route.upstreams if u.canary != side]
        up = pick(route, others)
        if up is not None:
            return up, ""
    if at is None:
        return pick(route, tried), ""
    return pick_prefix(route, at, gw.limits.prefix_policy, tried)


def pick(route: table.Route, exclude=(), now: float | None = None) -> table.Upstream | None:
    """The upstream with the fewest outstanding requests, ties broken at random.

    Replicas in ``exclude`` (already tried for this request) and those cooling
    down after failed connects or a timeout are skipped. Replicas on a suspect
    node are picked only when no other one is left: its engines may be frozen
    or cut off, and a request sent there may wait for nothing.
    """
    now = time.monotonic() if now is None else now
    best = None
    best_key = (True, 0)
    ties = 0
    for u in route.upstreams:
        if u.cooldown_until > now or u in exclude:
            continue
        key = (u.suspect, u.outstanding)
        if best is None or key < best_key:
            best, best_key, ties = u, key, 1
        elif key == best_key:
            # Reservoir sampling: each of the tied replicas is equally likely.
            ties += 1
            if random.random() * ties < 1:
                best = u
    return best


def pick_prefix(
    route: table.Route, key: int, policy: prefix.Policy, exclude=(), now: float | None = None
) -> tuple[table.Upstream | None, str]:
    """(upstream, how it was chosen) for a request whose prompt prefix hashes to ``key``.

    The same replicas are candidates as for ``pick`` (none tried already, none
    cooling down, suspect ones last); among them the prefix's replica on the
    ring while its load allows (``prefix.choose``), else the least busy.
    """
    now = time.monotonic() if now is None else now
    free, healthy = [], []
    for u in route.upstreams:
        if u.cooldown_until <= now and u not in exclude:
            free.append(u)
            if not u.suspect:
                healthy.append(u)
    available = healthy or free
    up, result = prefix.choose(route.ring, key, available, policy)
    if up is None and result:
        up = pick(route, exclude, now)
    return up, result
