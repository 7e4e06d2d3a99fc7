"""Per-key limits, shared by every gateway process through Redis.

Four limits per key (``ApiKey`` fields, else the ``LLMGW_GATEWAY_DEFAULT_*``
settings; 0 is none): requests per minute, tokens per minute, and token
budgets per UTC day and per UTC calendar month; and a fifth, the monthly token
budget of the key's team (``Team.tokens_per_month``), one counter shared by
every key of the team. Each is a counter in a fixed
window whose name carries the window (``…:rq:<key>:m<minute>``), so a window
ends by itself at its boundary and the counters expire after it.

A check is a Lua script run through redis-py's asyncio client: it reads the
token counters, refuses the request if one is spent or the request counter is
full, and counts the request otherwise, atomically, so two gateway processes
can never let more through between them than the limit. The checks that
arrive in one turn of the event loop go to Redis together, in one script call,
each with its own answer (``Limiter.check``).

A key far from all of its limits (more than 16 leases' worth of requests left
this minute, under 90 % of every token limit) is given a lease: the script
counts ``LEASE_REQUESTS`` more requests than the one checked, and this process
lets that many through without asking Redis again, renewing the lease in the
background when half is gone (``Lease``). The requests are counted before they
arrive, so the processes together still let through no more than the limit; a
lease not used up by the minute's end is wasted, at most ``LEASE_REQUESTS`` of
the key's minute for each process. Near a limit no lease is granted and every
request asks Redis, as above.

Tokens are charged when the engine reports them (its ``usage``): added up in
memory and sent with the next script call, which adds them before it reads
the counters, or within ``charge_delay_s`` when none comes. A lease counts
this process's tokens as they are charged and takes the others' from Redis at
most ``LEASE_S`` old: a token limit is decided on counters that miss no token
of this process and at most that long of the others'. A key with token limits
keeps its lease's counters even where no lease is granted, and a check whose
answer from Redis lacks tokens of this process still on their way (a call of
their own, on another connection) is refused on them.
A key without limits costs nothing: Redis is not asked.

Redis away or slow: the requests whose check got no answer (those of one call
share it) are refused with 503 and a Retry-After of ``gateway_limits_retry_s``
(``llmgw_gateway_limits_unavailable_total``), or, where the operator chose
``gateway_limits_fail_open``, pass unchecked
(``llmgw_gateway_limits_unchecked_total``). Nothing is switched off for the
requests after them: each asks Redis again, so one request that made a check
miss its deadline (a busy event loop, say) cannot let every key through; a
lease runs out within ``LEASE_S`` of Redis's last answer. The outage is logged
once, and again when Redis answers. Keys without limits never ask Redis, so
they are served whatever Redis does. Tokens whose call failed are kept and
sent with a later one.
"""

import asyncio
import logging
import math
import time

from django.conf import settings
from prometheus_client import Counter
from redis import asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from fleet.metrics import REGISTRY

from .errors import GatewayError
from .limit_answers import (
    DAY_TTL_S,
    LIMIT_NAMES,
    MINUTE_TTL_S,
    MONTH_TTL_S,
    KeyLimits,
    Windows,
    answer_headers,
    limit_values,
    refusal,
    reset_text,
)
from .limit_leases import LEASE_REQUESTS, Lease

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

# One call for the checks of a turn of the event loop, and the tokens charged since
# the last call, charged first so that the checks read them.
# KEYS: the M token counters to charge, then five for each check: its key's requests
# this minute, tokens this minute, this day, this month, and its team's tokens this
# month.
# ARGV: M; each counter's expiry and its tokens; then for each check its five limits
# (0: none), its request counter's expiry, the requests it counts (1; 0 for a lease's
# renewal) and the lease it asks for (requests counted ahead, ``Lease``). Expiries
# are set when a counter is made and outlast its window.
# Returns seven numbers a check: {refused, requests, tokens minute, tokens day, tokens
# month, team's month, lease granted}; refused names the limit (1 requests, 2
# tokens/min, 3 day, 4 month, 5 the team's month) or is 0. A lease is granted only
# far from every limit: more than 16 leases' worth of requests left, and under 90 %
# of every token limit. Checks of one key in one call count in order.
_CHECK = """
local m = tonumber(ARGV[1])
for i = 1, m do
  local n = tonumber(ARGV[1 + 2 * i])
  if redis.call('INCRBY', KEYS[i], n) == n then
    redis.call('EXPIRE', KEYS[i], ARGV[2 * i])
  end
end
local out = {}
local a = 1 + 2 * m
for k = m, #KEYS - 1, 5 do
  local rq = tonumber(redis.call('GET', KEYS[k + 1]) or '0')
  local tm = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
  local td = tonumber(redis.call('GET', KEYS[k + 3]) or '0')
  local tmo = tonumber(redis.call('GET', KEYS[k + 4]) or '0')
  local ttm = 0
  local lr, lt, ld = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local lmo, ltm = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  if ltm > 0 then ttm = tonumber(redis.call('GET', KEYS[k + 5]) or '0') end
  local refused = 0
  if ltm > 0 and ttm >= ltm then refused = 5
  elseif lmo > 0 and tmo >= lmo then refused = 4
  elseif ld > 0 and td >= ld then refused = 3
  elseif lt > 0 and tm >= lt then refused = 2
  elseif lr > 0 and rq >= lr then refused = 1
  end
  local count, want = tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8])
  local granted = 0
  if refused == 0 and want > 0 and (lr == 0 or lr - rq > 16 * want)
      and (lt == 0 or tm < 0.9 * lt) and (ld == 0 or td < 0.9 * ld)
      and (lmo == 0 or tmo < 0.9 * lmo) and (ltm == 0 or ttm < 0.9 * ltm) then
    granted = want
  end
  if refused == 0 and lr > 0 and count + granted > 0 then
    rq = redis.call('INCRBY', KEYS[k + 1], count + granted)
    if rq == count + granted then redis.call('EXPIRE', KEYS[k + 1], ARGV[a + 6]) end
  end
  out[#out + 1] = refused
  out[#out + 1] = rq
  out[#out + 1] = tm
  out[#out + 1] = td
  out[#out + 1] = tmo
  out[#out + 1] = ttm
  out[#out + 1] = granted
  a = a + 8
end
return out
"""

_FAILURES = (RedisError, OSError, TimeoutError)

# Connections to Redis a gateway process may hold: one per call under way. Past it
# (Redis hung while requests keep coming) a check fails at once, with its 503.
_CONNECTIONS = 256
# A backstop only: a call is cancelled at its own deadline.
_SOCKET_TIMEOUT_S = 5.0
# Tokens charged while no check comes are sent after at most this long.
_CHARGE_DELAY_S = 0.05


class Limiter:
    """One per gateway (event loop), with its own redis-py asyncio client.

    ``check`` queues its request's check; the checks queued in one turn of the event
    loop go to Redis in one script call, in a task of their own (``_call``), so no
    request's cancellation (its client gone) cuts the others' call short, with the
    tokens ``charge`` added up since the last call.
    """

    def __init__(
        self,
        url: str | None = None,
        prefix: str | None = None,
        retry_s: float = 2.0,
        fail_open: bool = False,
        timeout: float = 0.25,
        charge_delay_s: float = _CHARGE_DELAY_S,
    ):
        self.url = url or settings.REDIS_URL
        if prefix is None:
            prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"].get("prefix", "llmgw")
        self.prefix = f"{prefix}:limits"
        self.retry_s = retry_s  # the Retry-After of a request whose check got no answer
        self.fail_open = fail_open
        self.timeout = timeout  # how long a call waits for Redis
        self.charge_delay_s = charge_delay_s
        self._redis: aioredis.Redis | None = None
        self._script: AsyncScript | None = None
        self.down = False  # the last call to Redis failed: logged once, until one works
        # Checks for the next call: (their five counters, their six arguments, the future
        # of their answer); the task of that call, which takes them when it starts.
        self._queue: list[tuple[list[str], list, asyncio.Future]] = []
        self._forming: asyncio.Task | None = None
        # Tokens not sent yet, by counter: [its expiry, tokens]; and the timer that sends
        # them when no check does.
        self._charges: dict[str, list[int]] = {}
        self._charge_timer: asyncio.TimerHandle | None = None
        self._calls: set[asyncio.Task] = set()  # referenced until done
        self.leases: dict[int, Lease] = {}  # by key id
        self._asking: set[int] = set()  # keys whose check asking for a lease is under way

    async def close(self) -> None:
        """Send the tokens not sent yet, then close the client."""
        if self._queue or self._charges:
            self._call_soon()
        if self._calls:
            await asyncio.gather(*self._calls, return_exceptions=True)
        if self._charge_timer is not None:
            self._charge_timer.cancel()
            self._charge_timer = None
        if self._redis is not None:
            client, self._redis = self._redis, None
            await client.aclose(close_connection_pool=True)

    def _client(self) -> AsyncScript:
        if self._redis is None:
            self._redis = aioredis.Redis.from_url(
                self.url,
                max_connections=_CONNECTIONS,
                socket_connect_timeout=self.timeout,
                socket_timeout=_SOCKET_TIMEOUT_S,
            )
            # EVALSHA, loading the script first where Redis lacks it (a restart).
            self._script = self._redis.register_script(_CHECK)
        return self._script

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

    # ---- one call for many -----------------------------------------------------

    def _call_soon(self) -> None:
        """A call in the next turn of the loop, for whatever is queued when it starts."""
        if self._forming is None:
            self._forming = task = asyncio.ensure_future(self._call())
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _call(self) -> None:
        """One script call: the tokens charged so far added, then the queued checks
        made, each answered.

        Within the deadline (``timeout``) or not at all: a reply that came in time but
        was read late, because the event loop was busy elsewhere, is read before the
        deadline's timer cancels the wait, and counts
        (tests/gateway/test_security_limits.py). A call cancelled at its deadline costs
        its connection (redis-py closes it); Redis may still run it: the safe side. The
        tokens of a call that failed are kept for a later one (counted twice where
        Redis ran it after all: the safe side too).
        """
        self._forming = None
        if self._charge_timer is not None:
            self._charge_timer.cancel()
            self._charge_timer = None
        checks, self._queue = self._queue, []
        charges, self._charges = self._charges, {}
        if not checks and not charges:
            return
        keys = list(charges)
        args: list = [len(keys)]
        for ttl, tokens in charges.values():
            args += (ttl, tokens)
        for counters, limits, _ in checks:
            keys += counters
            args += limits
        try:
            script = self._client()
            async with asyncio.timeout(self.timeout):
                got = await script(keys=keys, args=args)
        except BaseException as exc:
            for counter, (ttl, tokens) in charges.items():
                self._add_charge(counter, ttl, tokens)
            failure = exc if isinstance(exc, _FAILURES) else TimeoutError("cancelled")
            for _, _, future in checks:
                if not future.done():
                    future.set_exception(failure)
            if not isinstance(exc, _FAILURES):
                raise
            if not checks:
                self._unavailable(failure)
            if self._charges:
                self._charge_later(self.retry_s)
            return
        if not checks:
            self._available()
        for i, (_, _, future) in enumerate(checks):
            if not future.done():
                future.set_result(got[7 * i : 7 * i + 7])

    def _add_charge(self, counter: str, ttl: int, tokens: int) -> None:
        pending = self._charges.get(counter)
        if pending is None:
            self._charges[counter] = [ttl, tokens]
        else:
            pending[1] += tokens

    def _charge_later(self, delay: float) -> None:
        """Send the tokens charged within ``delay``, unless a check's call takes them first."""
        if self._charge_timer is None and self._forming is None:
            self._charge_timer = asyncio.get_running_loop().call_later(delay, self._call_soon)

    # ---- the two operations ------------------------------------------------------

    def _ask(self, counters: list[str], args: list) -> asyncio.Future:
        """Queue a check for the next call; the future of its seven numbers."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append((counters, args, future))
        self._call_soon()
        return future

    async def check(self, entry, now: float | None = None) -> list[tuple[bytes, bytes]]:
        """Count a request of ``entry`` (a KeyEntry); its x-ratelimit-* headers, or a 429.

        No headers for a key without limits (Redis is not asked). Far from its limits,
        a key's request is taken from its lease (``Lease``) without a round trip, and
        the lease renewed in the background when it runs low. Where Redis does not
        answer, this request gets the 503 (or, failing open, passes unchecked with no
        headers), as do the others of its call; the next requests ask again.
        """
        lim: KeyLimits = entry.limits
        if not lim.on:
            return []
        now = time.time() if now is None else now
        w = Windows.at(now)
        at = asyncio.get_running_loop().time()
        lease = self.leases.get(entry.id)
        if lease is not None and lease.take(lim, w.minute, at):
            if lease.low(at):
                self._renew(entry.id, lease, w)
            return answer_headers(lim, w, lease.rq, lease.tm, lease.td, lease.tmo, lease.ttm)
        # A lease of these limits and this minute that cannot decide (too old, or a
        # token limit reached here) keeps what it holds.
        # One check of a key at a time asks for a lease: at most LEASE_REQUESTS in all.
        want = 0
        if entry.id not in self._asking:
            held = lease.left if lease is not None and lease.fits(lim, w.minute) else 0
            want = max(0, LEASE_REQUESTS - held)
        counters = self._keys(entry.id, w, lim.team_id)
        if want:
            self._asking.add(entry.id)
        try:
            got = await self._ask(counters, [*limit_values(lim), MINUTE_TTL_S, 1, want])
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
        finally:
            if want:
                self._asking.discard(entry.id)
        self._available()
        refused, rq, tm, td, tmo, ttm, granted = got
        lease = self.leases.get(entry.id)
        if lease is not None and not lease.fits(lim, w.minute):
            lease = None
            del self.leases[entry.id]
        if lease is None and (granted or lim.tokens_on):
            lease = self.leases[entry.id] = Lease(lim, w.minute)
        if lease is not None:
            lease.told(got, asyncio.get_running_loop().time())
            rq, tm, td, tmo, ttm = lease.rq, lease.tm, lease.td, lease.tmo, lease.ttm
            # This process's own tokens are spent whatever Redis read: a call that
            # sent them may reach Redis after this check's, on another connection.
            refused = refused or lease.spent()
        headers = answer_headers(lim, w, rq, tm, td, tmo, ttm)
        if refused:
            REFUSED.labels(LIMIT_NAMES[refused]).inc()
            raise refusal(entry, lim, w, refused, headers)
        return headers

    def _renew(self, key_id: int, lease: Lease, w: Windows) -> None:
        """Ask for more of ``lease`` in the next call, counting no request of its own."""
        lease.renewing = True
        lim = lease.limits
        counters = self._keys(key_id, w, lim.team_id)
        want = max(0, LEASE_REQUESTS - lease.left)
        future = self._ask(counters, [*limit_values(lim), MINUTE_TTL_S, 0, want])

        def renewed(done: asyncio.Future) -> None:
            lease.renewing = False
            if done.cancelled() or done.exception() is not None:
                return  # the lease runs out; the next check asks Redis and says why
            if self.leases.get(key_id) is lease:
                lease.told(done.result(), asyncio.get_running_loop().time())

        future.add_done_callback(renewed)

    async def charge(self, entry, tokens: int, now: float | None = None) -> None:
        """Count ``tokens`` against the key's token limits, once the engine has reported them.

        Added up here, and sent with the next check's call (before it reads them), or
        within ``charge_delay_s`` when no check comes: no round trip of its own.
        """
        lim: KeyLimits = entry.limits
        if tokens <= 0 or not lim.tokens_on:
            return
        now = time.time() if now is None else now
        w = Windows.at(now)
        _, tk_min, tk_day, tk_month, team_month = self._keys(entry.id, w, lim.team_id)
        for limit, counter, ttl in (
            (lim.tokens_per_minute, tk_min, MINUTE_TTL_S),
            (lim.tokens_per_day, tk_day, DAY_TTL_S),
            (lim.tokens_per_month, tk_month, MONTH_TTL_S),
            (lim.team_tokens_per_month, team_month, MONTH_TTL_S),
        ):
            if limit:
                self._add_charge(counter, ttl, tokens)
        self._charge_later(self.charge_delay_s)
        # The leases' counters count this process's tokens at once: the key's own, and
        # the team's in every lease of a key of the team.
        for key_id, lease in self.leases.items():
            if key_id == entry.id and lease.minute == w.minute:
                lease.tm += tokens
                lease.td += tokens
                lease.tmo += tokens
            if lim.team_id and lease.limits.team_id == lim.team_id:
                lease.ttm += tokens
