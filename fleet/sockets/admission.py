"""How many agents one web process takes through the handshake and registration at once.

After a control-plane restart the whole fleet knocks within seconds. Past what
the web process gets through in the agent's 10 s handshake wait, a queued
handshake is work for nothing: the agent gives up, backs off for up to 30 s
and comes again, and the fleet takes minutes to come back (docs/benchmarks.md,
Agent sockets). So a web process lets ``agent_handshakes_max`` sockets at a
time be between the knock and the register's ack; the next one is told at once
to come back later (HTTP 503 with ``Retry-After``), at an appointment: the
refused come back spread over what the process takes a second.

Where the web process is slower than the knocks, a queue can form before any of
this, in the kernel's listen queue: the web process takes it a batch a turn of its
loop (``llmgw_site.serve``), and behind the balancer of docs/scaling.md the
balancer holds the rest.

One instance per process (``admission()``), used from its event loop only.
"""

import logging
import math
import random
import time
from collections import deque

from agentd.protocol import RECONNECT_BACKOFF_CAP_S
from fleet.conf import fleet_settings
from fleet.metrics import AGENT_HANDSHAKES_TURNED_AWAY

logger = logging.getLogger("fleet.sockets.consumer")  # where operators read about agent sockets

# Registrations finished in this window set the pace the Retry-After is drawn from.
RATE_WINDOW_S = 5.0
# The pace assumed until a window's worth is known (a web process just started).
START_RATE_PER_S = 50.0
# Never longer than agentd's own backoff cap.
RETRY_AFTER_MAX_S = int(RECONNECT_BACKOFF_CAP_S)
# Appointments a second, as a share of the pace registrations go at: more than it,
# so the pace measured can grow to what the process takes.
BOOKED_OVER_PACE = 1.5
# Agents told to come back later are logged at most this often (each is counted).
TURNED_AWAY_LOG_EVERY_S = 10.0


class Admission:
    """Sockets between the knock and the register's ack: at most ``limit`` (0: no limit)."""

    def __init__(self, limit: int, clock=time.monotonic, rng: random.Random | None = None):
        self.limit = limit
        self.clock = clock
        self.rng = rng or random.Random()
        self.pending = 0
        self._finished: deque[float] = deque()  # when registrations finished, oldest first
        self._started = clock()
        self._booked: dict[int, int] = {}  # appointments given, by the second they fall in

    def enter(self) -> bool:
        """One more socket knocks: True if it is taken (``leave`` once it is through)."""
        if self.limit and self.pending >= self.limit:
            return False
        self.pending += 1
        return True

    def leave(self, registered: bool) -> None:
        """A taken socket is through: registered, or gone or refused before it was."""
        self.pending = max(0, self.pending - 1)
        if registered:
            self._finished.append(self.clock())

    def rate(self) -> float:
        """Registrations a second over the last ``RATE_WINDOW_S``."""
        now = self.clock()
        while self._finished and self._finished[0] < now - RATE_WINDOW_S:
            self._finished.popleft()
        if now - self._started < RATE_WINDOW_S and len(self._finished) < START_RATE_PER_S:
            return START_RATE_PER_S
        return max(1.0, len(self._finished) / RATE_WINDOW_S)

    def full(self) -> bool:
        return bool(self.limit) and self.pending >= self.limit

    def retry_after(self) -> int:
        """Whole seconds a refused agent should wait: an appointment.

        Each second, from when the sockets already taken will be through at the
        current pace, takes ``BOOKED_OVER_PACE`` times that pace in appointments,
        and the agent gets the first second with room: the refused come back
        spread over what the process takes, not all in the next few seconds to
        be refused again. Past agentd's backoff cap, a draw from its upper half.
        """
        now = int(self.clock())
        pace = self.rate()
        per_s = max(1, round(pace * BOOKED_OVER_PACE))
        if len(self._booked) > 4 * RETRY_AFTER_MAX_S:
            self._booked = {s: n for s, n in self._booked.items() if s > now}
        for wait in range(max(1, math.ceil(self.pending / pace)), RETRY_AFTER_MAX_S + 1):
            taken = self._booked.get(now + wait, 0)
            if taken < per_s:
                self._booked[now + wait] = taken + 1
                return wait
        return self.rng.randint(RETRY_AFTER_MAX_S // 2, RETRY_AFTER_MAX_S)


_admission: Admission | None = None


def admission() -> Admission:
    """This process's gate, made anew when the limit in force changes (tests change it;
    each socket leaves the gate it entered)."""
    global _admission
    limit = fleet_settings().agent_handshakes_max
    if _admission is None or _admission.limit != limit:
        _admission = Admission(limit)
    return _admission


class _TurnedAwayLog:
    at = float("-inf")  # monotonic time of the last line
    since = 0  # agents told to come back since (that one included)


_turned_away_log = _TurnedAwayLog()


def turn_away(gate: Admission, kind: str, why: str, client: str) -> tuple[int, str]:
    """An agent told to come back: (its appointment in whole seconds, what it is told).

    Counted (``kind``: the metric's label) and logged at most once every
    ``TURNED_AWAY_LOG_EVERY_S`` per process with how many since the last line: in a
    restart's wave they come by the hundred."""
    after, pending = gate.retry_after(), gate.pending
    AGENT_HANDSHAKES_TURNED_AWAY.labels(kind).inc()
    log = _turned_away_log
    log.since += 1
    now = time.monotonic()
    if now - log.at >= TURNED_AWAY_LOG_EVERY_S:
        logger.warning(
            "agents told to come back: %d since the last line; this one in %d s: %s "
            "client=%s pending=%d",
            log.since,
            after,
            why,
            client,
            pending,
        )
        log.at, log.since = now, 0
    return after, f"{why}; retry after {after} s"
