"""A key's limits, the windows they count in, and what a check's figures tell the client.

Pure, no Redis: ``ratelimit.Limiter`` asks Redis and hands the figures here for
OpenAI's ``x-ratelimit-*`` headers and, over a limit, the 429 in its words
(``refusal``). Changes when a limit is added or its answer's wording changes.
"""

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from .errors import GatewayError

MINUTE_TTL_S = 120
DAY_TTL_S = 2 * 86400
MONTH_TTL_S = 33 * 86400

LIMIT_NAMES = {
    1: "requests_per_minute",
    2: "tokens_per_minute",
    3: "tokens_per_day",
    4: "tokens_per_month",
    5: "team_tokens_per_month",
}


@dataclass(frozen=True)
class KeyLimits:
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    tokens_per_day: int = 0
    tokens_per_month: int = 0
    # The key's team's budget, shared by all of its keys (0: none, or no team).
    team_id: int = 0
    team: str = ""
    team_tokens_per_month: int = 0

    @property
    def on(self) -> bool:
        return bool(
            self.requests_per_minute
            or self.tokens_per_minute
            or self.tokens_per_day
            or self.tokens_per_month
            or self.team_tokens_per_month
        )

    @property
    def tokens_on(self) -> bool:
        return bool(
            self.tokens_per_minute
            or self.tokens_per_day
            or self.tokens_per_month
            or self.team_tokens_per_month
        )


NO_LIMITS = KeyLimits()


class Windows:
    """The windows ``now`` (Unix seconds) falls in, and the seconds until each ends.

    A plain class with slots, not a frozen dataclass: made once or twice a request,
    and a frozen dataclass's ``__init__`` costs several times as much."""

    __slots__ = ("minute", "day", "month", "minute_left", "day_left", "month_left")

    def __init__(
        self,
        minute: str,
        day: str,
        month: str,
        minute_left: float,
        day_left: float,
        month_left: float,
    ):
        self.minute, self.day, self.month = minute, day, month
        self.minute_left, self.day_left, self.month_left = minute_left, day_left, month_left

    @classmethod
    def at(cls, now: float) -> "Windows":
        day, month, day_end, month_end = _day(int(now // 86400))
        return cls(str(int(now // 60)), day, month, 60 - now % 60, day_end - now, month_end - now)


_DAYS: dict[int, tuple[str, str, float, float]] = {}


def _day(n: int) -> tuple[str, str, float, float]:
    """Day ``n`` since the epoch (UTC): its name, its month's, and when each ends. Cached."""
    got = _DAYS.get(n)
    if got is None:
        if len(_DAYS) > 64:
            _DAYS.clear()
        t = datetime.fromtimestamp(n * 86400, UTC)
        nxt = datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=UTC).timestamp()
        got = _DAYS[n] = (t.strftime("%Y%m%d"), t.strftime("%Y%m"), (n + 1) * 86400, nxt)
    return got


def reset_text(seconds: float) -> str:
    """A wait as OpenAI writes it in x-ratelimit-reset-*: "20ms", "1s", "6m0s", "2h3m0s"."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    s = math.ceil(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"


def limit_values(lim: KeyLimits) -> tuple[int, int, int, int, int]:
    return (
        lim.requests_per_minute,
        lim.tokens_per_minute,
        lim.tokens_per_day,
        lim.tokens_per_month,
        lim.team_tokens_per_month,
    )


def tokens_window(lim: KeyLimits, w: Windows, tm: int, td: int, tmo: int, ttm: int = 0):
    """(limit, remaining, seconds left) of the token limit with the least left."""
    best = None
    for limit, used, left in (
        (lim.tokens_per_minute, tm, w.minute_left),
        (lim.tokens_per_day, td, w.day_left),
        (lim.tokens_per_month, tmo, w.month_left),
        (lim.team_tokens_per_month, ttm, w.month_left),
    ):
        if limit:
            remaining = max(0, limit - used)
            if best is None or remaining < best[1]:
                best = (limit, remaining, left)
    return best


def answer_headers(lim: KeyLimits, w: Windows, rq, tm, td, tmo, ttm=0) -> list[tuple[bytes, bytes]]:
    headers = []
    if lim.requests_per_minute:
        headers += [
            (b"x-ratelimit-limit-requests", str(lim.requests_per_minute).encode()),
            (
                b"x-ratelimit-remaining-requests",
                str(max(0, lim.requests_per_minute - rq)).encode(),
            ),
            (b"x-ratelimit-reset-requests", reset_text(w.minute_left).encode()),
        ]
    tokens = tokens_window(lim, w, tm, td, tmo, ttm)
    if tokens is not None:
        limit, remaining, left = tokens
        headers += [
            (b"x-ratelimit-limit-tokens", str(limit).encode()),
            (b"x-ratelimit-remaining-tokens", str(remaining).encode()),
            (b"x-ratelimit-reset-tokens", reset_text(left).encode()),
        ]
    return headers


def refusal(entry, lim: KeyLimits, w: Windows, refused: int, headers) -> GatewayError:
    who = f"API key '{entry.name}' ({entry.prefix})"
    if refused == 1:
        message = f"{who} is over its limit of {lim.requests_per_minute} requests per minute"
        left, code = w.minute_left, "rate_limit_exceeded"
    elif refused == 2:
        message = f"{who} is over its limit of {lim.tokens_per_minute} tokens per minute"
        left, code = w.minute_left, "rate_limit_exceeded"
    elif refused == 3:
        message = f"{who} has used its budget of {lim.tokens_per_day} tokens for today (UTC)"
        left, code = w.day_left, "insufficient_quota"
    elif refused == 4:
        message = f"{who} has used its budget of {lim.tokens_per_month} tokens for this month (UTC)"
        left, code = w.month_left, "insufficient_quota"
    else:
        message = (
            f"team '{lim.team}' (of {who}) has used its budget of {lim.team_tokens_per_month} "
            "tokens for this month (UTC)"
        )
        left, code = w.month_left, "insufficient_quota"
    err = GatewayError(
        429, f"{message}; try again in {reset_text(left)}", code=code, retry_after=math.ceil(left)
    )
    err.extra_headers = headers
    return err
