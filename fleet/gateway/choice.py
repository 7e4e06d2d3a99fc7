"""Which replica an attempt goes to.

The least busy ready replica (``table.pick``), or the one the prompt's prefix
sits on (``table.pick_prefix``, for a model that routes by prefix); with a canary,
a first attempt goes to the canary's side for ``canary_percent`` of requests, the
same side for the same prefix. Replicas tried already for the request are skipped.
"""

import random

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
        up = table.pick(route, others)
        if up is not None:
            return up, ""
    if at is None:
        return table.pick(route, tried), ""
    return table.pick_prefix(route, at, gw.limits.prefix_policy, tried)
