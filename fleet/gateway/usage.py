"""Tokens per key, model and hour, counted in memory and written in batches.

A request adds to a dict (no I/O); every ``gateway_usage_flush_s`` the gateway
swaps the dict for an empty one and adds its sums to ``KeyUsage`` rows, one
UPDATE (or INSERT) per key, model and hour seen since, whatever the number of
requests. A clean stop (``Gateway.close``) writes what is left; a process
killed -9 loses at most what it counted since its last flush. A write that
fails keeps its sums for the next one.
"""

import logging
from datetime import UTC, datetime

from django.db import IntegrityError, transaction
from django.db.models import F

logger = logging.getLogger(__name__)


class Usage:
    __slots__ = ("counts",)

    def __init__(self):
        # (key id, model, hour start in Unix seconds) -> [requests, prompt, completion]
        self.counts: dict[tuple[int, str, int], list[int]] = {}

    def add(self, key_id: int, model: str, prompt: int, completion: int, now: float) -> None:
        slot = (key_id, model, int(now // 3600) * 3600)
        c = self.counts.get(slot)
        if c is None:
            self.counts[slot] = [1, prompt, completion]
        else:
            c[0] += 1
            c[1] += prompt
            c[2] += completion

    def take(self) -> dict:
        counts, self.counts = self.counts, {}
        return counts

    def put_back(self, counts: dict) -> None:
        for (key_id, model, hour), (n, p, c) in counts.items():
            mine = self.counts.setdefault((key_id, model, hour), [0, 0, 0])
            mine[0] += n
            mine[1] += p
            mine[2] += c


def write(counts: dict) -> int:
    """Add ``counts`` to the KeyUsage rows (sync; the gateway runs it in a thread)."""
    from fleet.models import ApiKey, KeyUsage

    live = set(ApiKey.objects.filter(pk__in={k for k, _, _ in counts}).values_list("pk", flat=True))
    written = 0
    for (key_id, model, hour), (n, p, c) in counts.items():
        if key_id not in live:
            continue  # deleted meanwhile: its usage went with it
        at = datetime.fromtimestamp(hour, UTC)
        rows = KeyUsage.objects.filter(key_id=key_id, model=model, hour=at)
        add = {
            "requests": F("requests") + n,
            "prompt_tokens": F("prompt_tokens") + p,
            "completion_tokens": F("completion_tokens") + c,
        }
        if not rows.update(**add):
            try:
                with transaction.atomic():
                    KeyUsage.objects.create(
                        key_id=key_id,
                        model=model,
                        hour=at,
                        requests=n,
                        prompt_tokens=p,
                        completion_tokens=c,
                    )
            except IntegrityError:
                # Another gateway process created the row first.
                rows.update(**add)
        written += 1
    return written
