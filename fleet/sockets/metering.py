"""What one agent socket may send: messages and bytes a second, with a burst saved up.

Every message is charged to its socket's ``Meter`` before it is parsed, so a
node sending more than an agent ever would costs little before it is closed
with 4029 (``limits``, the reason it hears). The limits are settings
(``LLMGW_AGENT_MESSAGES_PER_S``, ``..._BURST``, ``LLMGW_AGENT_BYTES_PER_S``,
``..._BURST``; a rate of 0: no limit). This changes with how sockets are
metered; what the consumer does past a limit is ``consumer``'s.
"""

from fleet.conf import fleet_settings


class TokenBucket:
    """``rate`` tokens a second, saved up to ``burst``; a rate of 0 takes anything."""

    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), now

    def take(self, amount: float, now: float) -> bool:
        if self.rate <= 0:
            return True
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if amount > self.tokens:
            return False
        self.tokens -= amount
        return True

    def give(self, amount: float) -> None:
        """Give back what a message was charged, up to the burst."""
        self.tokens = min(self.burst, self.tokens + amount)


class Meter:
    """One socket's buckets: a message each, and its size in bytes."""

    def __init__(self, now: float):
        s = fleet_settings()
        self.messages = TokenBucket(s.agent_messages_per_s, s.agent_messages_burst, now)
        self.bytes = TokenBucket(s.agent_bytes_per_s, s.agent_bytes_burst, now)

    def charge(self, text_data, bytes_data, now: float) -> int | None:
        """Charge a message to the buckets, before any parsing: its size in bytes, or None
        when it is past either limit (and nothing is charged)."""
        if text_data is not None:
            size = len(text_data.encode("utf-8", "surrogatepass"))
        else:
            size = len(bytes_data or b"")
        if not self.messages.take(1, now):
            return None
        if not self.bytes.take(size, now):
            self.messages.give(1)
            return None
        return size

    def give_back(self, size: int) -> None:
        """Give back a message's charge: one the control plane asked for (a log reply)."""
        self.messages.give(1)
        self.bytes.give(size)


def limits() -> str:
    """The limits in words, as a socket closed for passing them hears them."""
    s = fleet_settings()
    return (
        f"more than {s.agent_messages_per_s:g} messages or {s.agent_bytes_per_s:g} bytes "
        f"a second (bursts of {s.agent_messages_burst} and {s.agent_bytes_burst})"
    )
