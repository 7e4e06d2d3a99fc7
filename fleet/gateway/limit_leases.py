"""A key's lease: requests counted in Redis ahead of their arrival, let through by this
process without a round trip while the key is far from all of its limits.

Pure bookkeeping, no Redis: ``ratelimit.Limiter`` asks for leases in its script
calls and tells each what Redis answered. Changes when the lease's rule changes.
"""

from .limit_answers import KeyLimits

# A lease: requests counted in Redis ahead of their arrival, taken here without a
# round trip, for a key far from all of its limits (the script's rule). This many at
# a time, renewed when half are taken; the counters' values it carries (the other
# processes' requests and tokens) are at most LEASE_S old when a request is checked
# against them, this process's own tokens always included.
LEASE_REQUESTS = 64
LEASE_S = 0.05


class Lease:
    """What this process may let through for one key without asking Redis again.

    ``left`` requests counted in Redis already (this window's), the counters as Redis
    last told them plus this process's tokens since, and when they become too old to
    decide on (``until``, the loop's clock). Used only for the same limits and minute.

    A key with token limits has one even where Redis granted no request ahead
    (``left`` 0): its counters hold this process's tokens, which a check's answer may
    not include yet (a call that sent them still on its way, on another connection).
    """

    __slots__ = ("limits", "minute", "until", "left", "rq", "tm", "td", "tmo", "ttm", "renewing")

    def __init__(self, limits: KeyLimits, minute: str):
        self.limits, self.minute = limits, minute
        self.until = 0.0
        self.left = 0
        self.rq = self.tm = self.td = self.tmo = self.ttm = 0
        self.renewing = False

    def told(self, got: list, at: float) -> None:
        """Redis's answer to a check or renewal: its counters, and the requests granted.

        A token counter never goes down within the lease's minute: an answer read in
        Redis before this process's latest tokens reached it (a renewal under way while
        they were charged) is behind what the lease has counted since, not news.
        """
        _, rq, tm, td, tmo, ttm, granted = got
        self.tm, self.td = max(self.tm, tm), max(self.td, td)
        self.tmo, self.ttm = max(self.tmo, tmo), max(self.ttm, ttm)
        self.left += granted
        # Counted in Redis: those let through and those still held here.
        self.rq = rq - self.left
        self.until = at + LEASE_S

    def fits(self, limits: KeyLimits, minute: str) -> bool:
        """Whether the lease is of ``limits`` in ``minute``. The keys are loaded again
        every few seconds (``keys.load_keys``): equal limits are the same limits."""
        if limits is not self.limits:
            if limits != self.limits:
                return False
            self.limits = limits  # the next look is an identity
        return minute == self.minute

    def take(self, limits: KeyLimits, minute: str, at: float) -> bool:
        """One request let through from the lease; False where it cannot decide."""
        if self.left <= 0 or at >= self.until or not self.fits(limits, minute):
            return False
        # A token limit reached, as far as this process knows: Redis decides.
        if self.spent():
            return False
        self.left -= 1
        self.rq += 1
        return True

    def spent(self) -> int:
        """The token limit the lease's counters have reached, numbered as the script
        numbers its refusals (5 the team's month, 4 month, 3 day, 2 minute), or 0."""
        lim = self.limits
        if lim.team_tokens_per_month and self.ttm >= lim.team_tokens_per_month:
            return 5
        if lim.tokens_per_month and self.tmo >= lim.tokens_per_month:
            return 4
        if lim.tokens_per_day and self.td >= lim.tokens_per_day:
            return 3
        if lim.tokens_per_minute and self.tm >= lim.tokens_per_minute:
            return 2
        return 0

    def low(self, at: float) -> bool:
        return not self.renewing and (
            self.left <= LEASE_REQUESTS // 2 or at >= self.until - LEASE_S / 2
        )
