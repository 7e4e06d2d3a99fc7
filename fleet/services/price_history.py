"""Which price of each GPU class is in force now: what the admin's and the API's price lists
mark, beside every price each class had.

A price applies from the hour its ``effective_from`` falls in
(``costs.prices``), so the one in force now is the latest of its class that
falls in this hour or before. One query: the table is small.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

from fleet.models import Price


def in_force(now: datetime | None = None) -> dict[str, int]:
    """Per GPU class ("" for CPU-only nodes), the id of its price in force at ``now``."""
    now = (now or timezone.now()).astimezone(UTC)
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    found: dict[str, int] = {}
    for gpu_class, pk in (
        Price.objects.filter(effective_from__lt=next_hour)
        .order_by("gpu_class", "-effective_from")
        .values_list("gpu_class", "pk")
    ):
        found.setdefault(gpu_class, pk)
    return found
