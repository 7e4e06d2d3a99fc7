"""Tokens per key, model and hour, counted in memory and written in batches.

A request adds to a dict (no I/O); every ``gateway_usage_flush_s`` the gateway
swaps the dict for an empty one and adds its sums to ``KeyUsage`` rows, one
UPDATE (or INSERT) per key, model and hour seen since, whatever the number of
requests. A clean stop (``Gateway.close``) writes what is left; a process
killed -9 loses at most what it counted since its last flush. Each row is
written once or not at all (``write``): a database that goes away keeps the
rows not written yet for the next flush, and a row the database refuses is
dropped, logged, without holding up or repeating the others.
"""

import logging
from datetime import UTC, datetime

from django.db import IntegrityError, InterfaceError, OperationalError, transaction
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


def write(counts: dict) -> dict:
    """Add ``counts`` to the KeyUsage rows (sync; the gateway runs it in a thread).

    Each row in a transaction of its own, so each is written once or not at all:
    the rows this returns are those to try again (the database went away before
    them); a row the database refuses (a count past its column, say) is logged and
    dropped rather than tried, and put back, forever; the others are written.
    """
    from fleet.models import ApiKey, KeyUsage

    live = set(ApiKey.objects.filter(pk__in={k for k, _, _ in counts}).values_list("pk", flat=True))
    left = dict(counts)
    for slot, (n, p, c) in counts.items():
        key_id, model, hour = slot
        if key_id in live:
            try:
                with transaction.atomic():
                    _add(KeyUsage, key_id, model, datetime.fromtimestamp(hour, UTC), n, p, c)
            except (OperationalError, InterfaceError):
                logger.warning("key usage: the database went away; %d rows kept", len(left))
                return left
            except Exception:  # noqa: BLE001 - this row alone; the others go on
                logger.exception(
                    "key usage row dropped: the database refused it key_id=%s model=%s "
                    "hour=%s requests=%d prompt_tokens=%d completion_tokens=%d",
                    key_id,
                    model,
                    hour,
                    n,
                    p,
                    c,
                )
        # Written, dropped, or its key deleted meanwhile (its usage went with it).
        del left[slot]
    return left


def _add(KeyUsage, key_id: int, model: str, at: datetime, n: int, p: int, c: int) -> None:
    rows = KeyUsage.objects.filter(key_id=key_id, model=model, hour=at)
    add = {
        "requests": F("requests") + n,
        "prompt_tokens": F("prompt_tokens") + p,
        "completion_tokens": F("completion_tokens") + c,
    }
    if rows.update(**add):
        return
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
