"""How many agents one web process takes through the handshake and registration at once.

After a control-plane restart the whole fleet knocks within seconds. Past what
the web process gets through in the agent's 10 s handshake wait, a queued
handshake is work for nothing: the agent gives up, backs off for up to 30 s
and comes again, and the fleet takes minutes to come back (docs/benchmarks.md,
Agent sockets). So a web process lets ``agent_handshakes_max`` sockets at a
time be between the knock and the register's ack; the next one is told at once
to come back later (HTTP 503 with ``Retry-After``), at a time drawn so that the
refused come back spread over what the sockets already admitted will take.

One instance per process (``admission()``), used from its event loop only.
"""

import math
import random
import time
from collections import deque

from agentd.protocol import RECONNECT_BACKOFF_CAP_S
from fleet.conf import fleet_settings

# Registrations finished in this window set the pace the Retry-After is drawn from.
RATE_WINDOW_S = 5.0
# The pace assumed until a window's worth is known (a web process just started).
START_RATE_PER_S = 50.0
# Never longer than agentd's own backoff cap.
RETRY_AFTER_MAX_S = int(RECONNECT_BACKOFF_CAP_S)


class Admission:
    """Sockets between the knock and the register's ack: at most ``limit`` (0: no limit)."""

    def __init__(self, limit: int, clock=time.monotonic, rng: random.Random | None = None):
        self.limit = limit
        self.clock = clock
        self.rng = rng or random.Random()
        self.pending = 0
        self._finished: deque[float] = deque()  # when registrations finished, oldest first
        self._started = clock()

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

    def retry_after(self) -> int:
        """Whole seconds a refused agent should wait: drawn from 1 to twice the time the
        sockets already taken need at the current pace, so the refused come back spread."""
        spread = 2 * self.pending / self.rate()
        return self.rng.randint(1, max(2, min(RETRY_AFTER_MAX_S, math.ceil(spread))))


_admission: Admission | None = None


def admission() -> Admission:
    """This process's gate, made anew when the limit in force changes (tests change it;
    each socket leaves the gate it entered)."""
    global _admission
    limit = fleet_settings().agent_handshakes_max
    if _admission is None or _admission.limit != limit:
        _admission = Admission(limit)
    return _admission
