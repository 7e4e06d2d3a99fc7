"""A canary's figures beside its active profile's, from every gateway process, through
Redis (docs/operations.md, "Canaries"): what the reconciler judges a canary by.

Each gateway process counts, per model running a canary and per profile, the
answers, those that were 5xx, and streams' time to the first token in buckets
(``Tally``), from the moment it saw that canary. Every load report it writes
its counts as one field of a Redis hash of that canary's own; the reconciler
adds the fields up (``read``). A new canary is a new hash, so no count of an
earlier one mixes in; a hash expires an hour after its last write.
"""

from __future__ import annotations

import bisect
import json
import logging
from dataclasses import dataclass, field

from .autoscaler.load import figures_redis
from .reconciler.lock import prefix

logger = logging.getLogger(__name__)

# Upper bounds of the time-to-first-token buckets, seconds; the last catches the rest.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, float("inf"))
KEEP_S = 3600


@dataclass
class Tally:
    """One profile's answers: how many, how many 5xx, and streams' first tokens."""

    requests: int = 0
    errors: int = 0
    ttft: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS))

    def answered(self, status: int) -> None:
        self.requests += 1
        if status >= 500:
            self.errors += 1

    def first_token(self, seconds: float) -> None:
        self.ttft[bisect.bisect_left(TTFT_BUCKETS, seconds)] += 1

    def add(self, other: Tally) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.ttft = [a + b for a, b in zip(self.ttft, other.ttft, strict=True)]

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def streams(self) -> int:
        return sum(self.ttft)

    def p95_ttft(self) -> float | None:
        """The bucket bound under which 95 % of first tokens came; None without streams."""
        total, seen = self.streams, 0
        for bound, n in zip(TTFT_BUCKETS, self.ttft, strict=True):
            seen += n
            if total and seen >= 0.95 * total:
                return bound
        return None

    def as_list(self) -> list:
        return [self.requests, self.errors, self.ttft]

    @classmethod
    def from_list(cls, raw) -> Tally:
        requests, errors, ttft = raw
        if len(ttft) != len(TTFT_BUCKETS):
            raise ValueError("bucket count")
        return cls(int(requests), int(errors), [int(n) for n in ttft])


def _key(model: str, canary_id: int) -> str:
    return f"{prefix()}:canary:{model}:{canary_id}"


def encode(counts: dict[tuple[str, int], dict[str, Tally]]) -> dict[tuple[str, int], str]:
    """This process's counts as written, made where they are counted (the event loop)."""
    return {
        key: json.dumps({p: t.as_list() for p, t in by_profile.items()}, separators=(",", ":"))
        for key, by_profile in counts.items()
    }


def write(source: str, bodies: dict[tuple[str, int], str]) -> None:
    """This process's counts (``encode``), one hash field per canary. Raises
    redis.RedisError; the caller logs it once and tries again next time."""
    pipe = figures_redis().pipeline(transaction=False)
    for (model, canary_id), body in bodies.items():
        pipe.hset(_key(model, canary_id), source, body)
        pipe.expire(_key(model, canary_id), KEEP_S)
    pipe.execute()


def read(model: str, canary_id: int) -> dict[str, Tally]:
    """Every gateway process's counts for this canary, added up per profile name."""
    out: dict[str, Tally] = {}
    for raw in figures_redis().hgetall(_key(model, canary_id)).values():
        try:
            for profile, counts in json.loads(raw).items():
                out.setdefault(profile, Tally()).add(Tally.from_list(counts))
        except (ValueError, TypeError, AttributeError):
            logger.warning("canary: a gateway's figures could not be read: %r", raw[:200])
    return out


def forget() -> None:
    """Drop every canary's figures this installation kept (tests)."""
    client = figures_redis()
    keys = list(client.scan_iter(match=f"{prefix()}:canary:*", count=1000))
    if keys:
        client.delete(*keys)
