"""Per-key limits, shared by every gateway process through Redis.

Four limits per key (``ApiKey`` fields, else the ``LLMGW_GATEWAY_DEFAULT_*``
settings; 0 is none): requests per minute, tokens per minute, and token
budgets per UTC day and per UTC calendar month; and a fifth, the monthly token
budget of the key's team (``Team.tokens_per_month``), one counter shared by
every key of the team. Each is a counter in a fixed
window whose name carries the window (``…:rq:<key>:m<minute>``), so a window
ends by itself at its boundary and the counters expire after it.

A request costs one round trip through redis-py's asyncio client: a Lua script
that reads the token counters, refuses the request if one is spent or the
request counter is full, and counts the request otherwise, atomically, so two
gateway processes can never let more through between them than the limit.
Tokens are charged when the engine reports them (its ``usage``), in one more
round trip after the answer has gone.
A key without limits costs nothing: Redis is not asked.

Redis away or slow: the request whose check got no answer, and only that
one, is refused with 503 and a Retry-After of ``gateway_limits_retry_s``
(``llmgw_gateway_limits_unavailable_total``), or, where the operator chose
``gateway_limits_fail_open``, passes unchecked
(``llmgw_gateway_limits_unchecked_total``). Nothing is switched off for the
requests after it: each asks Redis again, so one request that made a check
miss its deadline (a busy event loop, say) cannot let every key through. The
outage is logged once, and again when Redis answers. Keys without limits never
ask Redis, so they are served whatever Redis does.
"""

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from prometheus_client import Counter
from redis import asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from fleet.metrics import REGISTRY

from .errors import GatewayError

logger = logging.getLogger(__name__)

UNCHECKED = Counter(
    "llmgw_gateway_limits_unchecked",
    "Requests let through without checking their key's limits because Redis did not answer.",
    registry=REGISTRY,
)
UNAVAILABLE = Counter(
    "llmgw_gateway_limits_unavailable",
    "Requests refused with 503 because Redis did not answer their key's limit check "
    "(limits fail closed unless GATEWAY_LIMITS_FAIL_OPEN).",
    registry=REGISTRY,
)
REFUSED = Counter(
    "llmgw_gateway_limits_refused",
    "Requests refused with 429 because their key was over a limit, by limit.",
    ["limit"],
    registry=REGISTRY,
)

# KEYS: requests this minute, tokens this minute, this day, this month, and the
# team's tokens this month.
# ARGV: the five limits (0: none), then the request counter's expiry in seconds.
# Expiries are set when a counter is made and outlast its window.
# Returns {refused, requests, tokens minute, tokens day, tokens month, team's
# month}; refused names the limit (1 requests, 2 tokens/min, 3 day, 4 month, 5
# the team's month) or is 0.
_CHECK = """
local rq = tonumber(redis.call('GET', KEYS[1]) or '0')
local tm = tonumber(redis.call('GET', KEYS[2]) or '0')
local td = tonumber(redis.call('GET', KEYS[3]) or '0')
local tmo = tonumber(redis.call('GET', KEYS[4]) or '0')
local ttm = 0
local lr, lt, ld, lmo = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local ltm = tonumber(ARGV[5])
if ltm > 0 then ttm = tonumber(redis.call('GET', KEYS[5]) or '0') end
local refused = 0
if ltm > 0 and ttm >= ltm then refused = 5
elseif lmo > 0 and tmo >= lmo then refused = 4
elseif ld > 0 and td >= ld then refused = 3
elseif lt > 0 and tm >= lt then refused = 2
elseif lr > 0 and rq >= lr then refused = 1
end
if refused == 0 and lr > 0 then
  rq = redis.call('INCR', KEYS[1])
  if rq == 1 then redis.call('EXPIRE', KEYS[1], ARGV[6]) end
end
return {refused, rq, tm, td, tmo, ttm}
"""

# KEYS: the token counters to charge; ARGV: each one's expiry, then the tokens.
_CHARGE = """
local n = ARGV[#ARGV]
for i, k in ipairs(KEYS) do
  if redis.call('INCRBY', k, n) == tonumber(n) then
    redis.call('EXPIRE', k, ARGV[i])
  end
end
return 0
"""

_MINUTE_TTL_S = 120
_DAY_TTL_S = 2 * 86400
_MONTH_TTL_S = 33 * 86400

_NAMES = {
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


@dataclass(frozen=True)
class Windows:
    """The windows ``now`` (Unix seconds) falls in, and the seconds until each ends."""

    minute: str
    day: str
    month: str
    minute_left: float
    day_left: float
    month_left: float

    @classmethod
    def at(cls, now: float) -> "Windows":
        day, month, day_end, month_end = _day(int(now // 86400))
        return cls(
            minute=str(int(now // 60)),
            day=day,
            month=month,
            minute_left=60 - now % 60,
            day_left=day_end - now,
            month_left=month_end - now,
        )


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


_FAILURES = (RedisError, OSError, TimeoutError)

# Connections to Redis a gateway process may hold: one per check under way. Past
# it (Redis hung while requests keep coming) a check fails at once, with its 503.
_CONNECTIONS = 256
# A backstop only: a check is cancelled at its own deadline.
_SOCKET_TIMEOUT_S = 5.0


class Limiter:
    """One per gateway (event loop), with its own redis-py asyncio client."""

    def __init__(
        self,
        url: str | None = None,
        prefix: str | None = None,
        retry_s: float = 2.0,
        fail_open: bool = False,
        timeout: float = 0.25,
    ):
        self.url = url or settings.REDIS_URL
        if prefix is None:
            prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"].get("prefix", "llmgw")
        self.prefix = f"{prefix}:limits"
        self.retry_s = retry_s  # the Retry-After of a request whose check got no answer
        self.fail_open = fail_open
        self.timeout = timeout  # how long a check waits for Redis
        self._redis: aioredis.Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self.down = False  # the last call to Redis failed: logged once, until one works

    async def close(self) -> None:
        if self._redis is not None:
            client, self._redis = self._redis, None
            await client.aclose(close_connection_pool=True)

    def _client(self) -> aioredis.Redis:
        if self._redis is None:
            self._redis = aioredis.Redis.from_url(
                self.url,
                max_connections=_CONNECTIONS,
                socket_connect_timeout=self.timeout,
                socket_timeout=_SOCKET_TIMEOUT_S,
            )
            # EVALSHA, loading the script first where Redis lacks it (a restart).
            self._scripts = {s: self._redis.register_script(s) for s in (_CHECK, _CHARGE)}
        return self._redis

    async def _run(self, script: str, keys: list[str], args: list) -> list:
        """The script's answer within the deadline, else TimeoutError.

        A reply that came in time but was read late, because the event loop was busy
        elsewhere, is read before the deadline's timer cancels the wait, and counts
        (tests/gateway/test_security_limits.py). A command cancelled at its deadline
        costs its connection (redis-py closes it); Redis may still run it: the safe
        side.
        """
        self._client()
        async with asyncio.timeout(self.timeout):
            return await self._scripts[script](keys=keys, args=args)

    def _keys(self, key_id: int, w: Windows, team_id: int = 0) -> list[str]:
        p = self.prefix
        return [
            f"{p}:rq:{key_id}:m{w.minute}",
            f"{p}:tk:{key_id}:m{w.minute}",
            f"{p}:tk:{key_id}:d{w.day}",
            f"{p}:tk:{key_id}:M{w.month}",
            f"{p}:team:{team_id}:M{w.month}",
        ]

    def _unavailable(self, exc: Exception) -> None:
        if not self.down:
            self.down = True
            logger.warning(
                "limits: Redis did not answer, requests of keys with limits %s until it does: %s",
                "pass unchecked" if self.fail_open else "are refused with 503",
                exc,
            )

    def _available(self) -> None:
        if self.down:
            self.down = False
            logger.warning("limits: Redis answers again, limits are checked again")

    async def check(self, entry, now: float | None = None) -> list[tuple[bytes, bytes]]:
        """Count a request of ``entry`` (a KeyEntry); its x-ratelimit-* headers, or a 429.

        No headers for a key without limits (Redis is not asked). Where Redis does
        not answer, this request alone gets the 503 (or, failing open, passes
        unchecked with no headers).
        """
        lim: KeyLimits = entry.limits
        if not lim.on:
            return []
        now = time.time() if now is None else now
        w = Windows.at(now)
        try:
            args = [*_limits(lim), _MINUTE_TTL_S]
            keys = self._keys(entry.id, w, lim.team_id)
            refused, rq, tm, td, tmo, ttm = await self._run(_CHECK, keys, args)
        except _FAILURES as exc:
            self._unavailable(exc)
            if self.fail_open:
                UNCHECKED.inc()
                return []
            UNAVAILABLE.inc()
            raise GatewayError(
                503,
                f"the limits of API key '{entry.name}' ({entry.prefix}) could not be checked: "
                f"Redis did not answer; try again in {reset_text(self.retry_s)}",
                code="limits_unavailable",
                retry_after=max(1, math.ceil(self.retry_s)),
            ) from None
        self._available()
        headers = _headers(lim, w, rq, tm, td, tmo, ttm)
        if refused:
            REFUSED.labels(_NAMES[refused]).inc()
            raise _refusal(entry, lim, w, refused, headers)
        return headers

    async def charge(self, entry, tokens: int, now: float | None = None) -> None:
        """Count ``tokens`` against the key's token limits, once the engine has reported them.

        Called after the answer has gone, so waiting for Redis costs the client nothing.
        """
        lim: KeyLimits = entry.limits
        if tokens <= 0 or not lim.tokens_on:
            return
        now = time.time() if now is None else now
        w = Windows.at(now)
        _, tk_min, tk_day, tk_month, team_month = self._keys(entry.id, w, lim.team_id)
        keys, ttls = [], []
        for limit, k, ttl in (
            (lim.tokens_per_minute, tk_min, _MINUTE_TTL_S),
            (lim.tokens_per_day, tk_day, _DAY_TTL_S),
            (lim.tokens_per_month, tk_month, _MONTH_TTL_S),
            (lim.team_tokens_per_month, team_month, _MONTH_TTL_S),
        ):
            if limit:
                keys.append(k)
                ttls.append(ttl)
        try:
            await self._run(_CHARGE, keys, [*ttls, tokens])
        except _FAILURES as exc:
            self._unavailable(exc)
            return
        self._available()


def _limits(lim: KeyLimits) -> tuple[int, int, int, int, int]:
    return (
        lim.requests_per_minute,
        lim.tokens_per_minute,
        lim.tokens_per_day,
        lim.tokens_per_month,
        lim.team_tokens_per_month,
    )


def _tokens_window(lim: KeyLimits, w: Windows, tm: int, td: int, tmo: int, ttm: int = 0):
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


def _headers(lim: KeyLimits, w: Windows, rq, tm, td, tmo, ttm=0) -> list[tuple[bytes, bytes]]:
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
    tokens = _tokens_window(lim, w, tm, td, tmo, ttm)
    if tokens is not None:
        limit, remaining, left = tokens
        headers += [
            (b"x-ratelimit-limit-tokens", str(limit).encode()),
            (b"x-ratelimit-remaining-tokens", str(remaining).encode()),
            (b"x-ratelimit-reset-tokens", reset_text(left).encode()),
        ]
    return headers


def _refusal(entry, lim: KeyLimits, w: Windows, refused: int, headers) -> GatewayError:
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
