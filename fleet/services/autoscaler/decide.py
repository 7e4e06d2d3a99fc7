"""The autoscaler's decision: facts in, a number of replicas and its reason out.

No database, no clock, no Redis: ``decide`` takes what the reconciler read
(``Facts``) and the model's rules (``Policy``) and says what ``desired_replicas``
should be, so its rules are tested with tables of cases.

The rules, in order:

1. A target outside ``[min_replicas, max_replicas]`` is brought inside.
2. A model at zero with requests waiting (or in flight) wakes at once, with
   enough replicas for them; no cool-down holds this back.
3. A model that may go to zero (``min_replicas`` 0) and has had no request for
   ``scale_to_zero_after_s``, with nothing in flight or waiting, goes to zero; so
   does one that sleeps and has been asleep ``stop_after_asleep_s`` (no request for
   ``sleep_after_s`` plus that).
4. Load: outstanding requests (in flight plus waiting) per ready replica.
   Above ``target × (1 + hysteresis)`` it steps up to as many replicas as the
   load needs at the target; it steps down by one only when one replica fewer
   would still be under ``target × (1 - hysteresis)``. Load never takes it
   below one replica (only idleness does). A step waits for the previous one's
   replicas to be ready, and for the cool-down since the last decision (longer
   down than up), so a burst does not make it flap.
"""

import math
from dataclasses import dataclass

UP = "up"
DOWN = "down"


@dataclass(frozen=True)
class Policy:
    min_replicas: int
    max_replicas: int
    target: float  # outstanding requests per ready replica
    idle_s: float | None  # scale to zero after this long without a request; None: never
    sleep_s: float | None = None  # asleep after this long without a request; None: never
    stop_asleep_s: float | None = None  # to zero after this long asleep; None: never
    hysteresis: float = 0.2
    up_cooldown_s: float = 15.0
    down_cooldown_s: float = 120.0


@dataclass(frozen=True)
class Facts:
    desired: int  # desired_replicas now
    ready: int  # ready replicas of the active profile
    outstanding: float  # in flight at the gateways, every process added up
    waiting: int  # waiting at the gateways for a replica
    idle_s: float | None  # since the last request (or the last decision); None: unknown
    since_scaled_s: float | None  # since the last decision; None: never


@dataclass(frozen=True)
class Decision:
    desired: int
    direction: str = ""  # UP, DOWN, or "" for no change
    reason: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.direction)


def _n(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def decide(policy: Policy, facts: Facts) -> Decision:
    lo, hi, d = policy.min_replicas, policy.max_replicas, facts.desired
    demand = facts.outstanding + facts.waiting
    if d > hi:
        return Decision(hi, DOWN, f"{d} replicas is above max_replicas {hi}")
    if d < lo:
        return Decision(lo, UP, f"{d} replicas is below min_replicas {lo}")
    if d == 0:
        if demand <= 0:
            return Decision(0)
        n = max(1, min(hi, math.ceil(demand / policy.target)))
        return Decision(n, UP, f"scaled to zero and {_n(demand)} request(s) waiting: starting {n}")
    if (
        lo == 0
        and policy.idle_s is not None
        and demand <= 0
        and facts.idle_s is not None
        and facts.idle_s >= policy.idle_s
    ):
        return Decision(
            0,
            DOWN,
            f"no request for {facts.idle_s:.0f} s (scale to zero after {policy.idle_s:g} s)",
        )
    if (
        lo == 0
        and policy.sleep_s is not None
        and policy.stop_asleep_s is not None
        and demand <= 0
        and facts.idle_s is not None
        and facts.idle_s >= policy.sleep_s + policy.stop_asleep_s
    ):
        asleep = facts.idle_s - policy.sleep_s
        return Decision(
            0,
            DOWN,
            f"asleep for {asleep:.0f} s (stop after {policy.stop_asleep_s:g} s asleep)",
        )
    if facts.ready < d:
        return Decision(d)  # the last step's replicas are not all ready yet
    per = demand / facts.ready
    since = facts.since_scaled_s
    high = policy.target * (1 + policy.hysteresis)
    if per > high and d < hi:
        if since is not None and since < policy.up_cooldown_s:
            return Decision(d)
        n = min(hi, max(d + 1, math.ceil(demand / policy.target)))
        return Decision(
            n,
            UP,
            f"{_n(demand)} outstanding on {facts.ready} ready replica(s): {_n(per)} each, "
            f"above target {_n(policy.target)} + {policy.hysteresis:.0%}",
        )
    floor = max(lo, 1)
    if d > floor:
        after = demand / (d - 1)
        low = policy.target * (1 - policy.hysteresis)
        if after < low:
            if since is not None and since < policy.down_cooldown_s:
                return Decision(d)
            return Decision(
                d - 1,
                DOWN,
                f"{_n(demand)} outstanding on {facts.ready} ready replica(s): {_n(per)} each; "
                f"{d - 1} would carry {_n(after)}, under target {_n(policy.target)} "
                f"- {policy.hysteresis:.0%}",
            )
    return Decision(d)
