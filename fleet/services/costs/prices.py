"""Prices: which price an hour of a GPU is charged, and setting one (with its history).

A price applies from the hour its ``effective_from`` falls in, until the next
price of its class: an hour is priced whole, at the last price that took effect
before it ended, so a price set now prices the hour under way (a price from
14:30 prices 14:00-15:00 too). A GPU is priced by the longest price class its name
contains, case-blind, as a profile's ``gpu_class`` matches GPUs
(fleet.services.placement); a class with no price yet in effect at that hour
gives way to a shorter one that has one. A CPU-only node's hour is priced by
the class "". An hour with no price costs 0 in the fleet's currency, and the
report says which GPUs had none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import DecimalField, F, FloatField, Value
from django.db.models.functions import Cast
from django.utils import timezone

from fleet.conf import fleet_settings
from fleet.models import CostHour, Price

from .. import permissions
from .budgets import forget_closed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PriceFact:
    gpu_class: str
    per_hour: Decimal
    currency: str
    effective_from: datetime


def facts() -> list[PriceFact]:
    """Every price, oldest first: a small table, read whole."""
    return [
        PriceFact(*row)
        for row in Price.objects.order_by("effective_from", "gpu_class").values_list(
            "gpu_class", "per_hour", "currency", "effective_from"
        )
    ]


def matches(price_class: str, gpu_name: str) -> bool:
    """Whether a price's class prices this GPU (""  for a CPU-only node's hour)."""
    if not gpu_name or not price_class:
        return gpu_name == price_class
    return price_class.lower() in gpu_name.lower()


def _hour(t: datetime) -> datetime:
    """The start of the first hour a price from ``t`` prices: the hour ``t`` falls in."""
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def pick(gpu_name: str, prices: list[PriceFact], when: datetime) -> PriceFact | None:
    """The price of the hour of ``gpu_name`` beginning at ``when``: of the classes it matches
    that have a price in effect, the longest class's latest."""
    best = None
    for p in prices:
        if _hour(p.effective_from) > when or not matches(p.gpu_class, gpu_name):
            continue
        if best is None or (len(p.gpu_class), p.effective_from) >= (
            len(best.gpu_class),
            best.effective_from,
        ):
            best = p
    return best


def timeline(gpu_name: str, prices: list[PriceFact]) -> list[tuple[datetime | None, PriceFact]]:
    """When the price of ``gpu_name`` changes: (from, price) in order; the first from None
    when an unpriced time comes before (its price None)."""
    points = sorted({_hour(p.effective_from) for p in prices if matches(p.gpu_class, gpu_name)})
    out: list = [(None, None)]
    for at in points:
        got = pick(gpu_name, prices, at)
        if got != out[-1][1]:
            out.append((at, got))
    return out


def price_at(gpu_class: str, when: datetime | None = None) -> Price | None:
    """The price of exactly ``gpu_class`` in effect at ``when`` (default now), or None."""
    when = when or timezone.now()
    return (
        Price.objects.filter(gpu_class=gpu_class, effective_from__lte=when)
        .order_by("-effective_from")
        .first()
    )


def reprice(since: datetime, until: datetime | None = None, prices=None) -> int:
    """Cost every CostHour from ``since`` (to ``until``) at the prices in effect: one UPDATE
    per GPU name and price period, however many rows. Returns the rows written."""
    prices = facts() if prices is None else prices
    rows = CostHour.objects.filter(hour__gte=since)
    if until is not None:
        rows = rows.filter(hour__lt=until)
    names = sorted(set(rows.order_by().values_list("gpu_class", flat=True).distinct()))
    written = 0
    fallback = fleet_settings().cost_currency
    for name in names:
        periods = timeline(name, prices)
        for i, (start, price) in enumerate(periods):
            end = periods[i + 1][0] if i + 1 < len(periods) else None
            if end is not None and end <= since:
                continue
            part = rows.filter(gpu_class=name)
            if start is not None:
                part = part.filter(hour__gte=start)
            if end is not None:
                part = part.filter(hour__lt=end)
            written += part.update(**cost_of(price, fallback))
    return written


def cost_of(price: PriceFact | None, fallback: str) -> dict:
    """The columns that price a CostHour row in SQL: its GPU-seconds × the price an hour."""
    if price is None:
        return {"cost": Decimal(0), "currency": fallback}
    per_second = float(price.per_hour) / 3600.0
    seconds = Cast(F("gpu_seconds"), FloatField()) * Value(per_second, output_field=FloatField())
    return {
        "cost": Cast(seconds, DecimalField(max_digits=18, decimal_places=6)),
        "currency": price.currency,
    }


def set_price(
    gpu_class: str,
    per_hour,
    currency: str | None = None,
    effective_from: datetime | None = None,
    actor=permissions.SYSTEM,
) -> Price:
    """A price for ``gpu_class`` from ``effective_from`` (default now); one of the same class
    and date is replaced. The hours it prices that were counted already (the hour under
    way, and more for a price dated back) are priced again at once, closed ones too.
    Refused without ``price.set``."""
    permissions.require_action(actor, "price.set", f"set the price of {_named(gpu_class)}")
    when = effective_from or timezone.now()
    price = Price.objects.filter(gpu_class=gpu_class, effective_from=when).first() or Price(
        gpu_class=gpu_class, effective_from=when
    )
    try:
        price.per_hour = Decimal(str(per_hour))
    except ArithmeticError:
        raise ValidationError({"per_hour": f"'{per_hour}' is not a number"}) from None
    price.currency = currency or fleet_settings().cost_currency
    price.full_clean(validate_unique=False)
    with transaction.atomic():
        price.save()
        repriced = reprice(_hour(when))
        forget_closed()  # the teams' spending is summed again at the next count
    logger.info(
        "price set: %s %s %s/h from %s by %s (%d cost rows priced again)",
        _named(gpu_class),
        price.per_hour,
        price.currency,
        when.isoformat(),
        permissions.name_of(actor),
        repriced,
    )
    return price


def _named(gpu_class: str) -> str:
    return f"GPU class '{gpu_class}'" if gpu_class else "a CPU-only node"
