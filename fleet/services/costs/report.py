"""What a period cost, by team, model or GPU class, from the CostHour rows alone.

Two queries whatever the fleet's size (the period's rows summed by owner, and
each model's peak), and the prices (a small table): a page or an export never
reads the replicas' history. A period is whole hours: from the hour ``start``
falls in to the one ``end`` falls in, that one left out; the hour under way
counts what was counted of it so far.

Utilisation is the tokens served against what the GPU-hours could have served
at the model's peak: llmgw keeps no benchmark of a model's throughput, so its
peak is measured from its own hours, the most tokens per GPU-hour it served in
one closed hour of the 30 days up to the period's end (or of the period, when
longer) where it held at least a tenth of a GPU-hour. The tokens of an hour sit
on the model's row of the GPU class it held most, so for a model that held two
classes in one hour the peak is taken on that class alone. None: the model
served no tokens in such an hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import F, FloatField, Max, Min, Q, Sum
from django.db.models.functions import Cast

from fleet.models import CostHour

from . import prices
from .accrual import HOUR, hour_of

BY = ("team", "model", "gpu_class")
PEAK_WINDOW = timedelta(days=30)
PEAK_MIN_GPU_S = 360.0  # a tenth of a GPU-hour


@dataclass
class CostRow:
    """One line of a report: a team, a model, a GPU class (those reported by), or idle."""

    team: str | None = None  # None: not reported by; "": the fleet's (no team)
    model: str | None = None
    gpu_class: str | None = None  # "": CPU-only nodes
    idle: bool = False
    currency: str = ""
    gpu_hours: float = 0.0
    cost: Decimal = Decimal(0)
    tokens: int = 0
    # Tokens the GPU-hours could have served at their models' peaks (models with one).
    capacity_tokens: float = 0.0
    served_at_peak: int = 0  # the tokens of those models

    @property
    def cost_per_million_tokens(self) -> Decimal | None:
        if not self.tokens:
            return None
        return (self.cost * 1_000_000 / self.tokens).quantize(Decimal("0.000001"))

    @property
    def utilisation(self) -> float | None:
        if self.idle or not self.capacity_tokens:
            return None
        return self.served_at_peak / self.capacity_tokens

    def as_dict(self) -> dict:
        return {
            "team": self.team,
            "model": self.model,
            "gpu_class": self.gpu_class,
            "idle": self.idle,
            "gpu_hours": self.gpu_hours,
            "cost": self.cost,
            "currency": self.currency,
            "tokens": self.tokens,
            "cost_per_million_tokens": self.cost_per_million_tokens,
            "utilisation": self.utilisation,
        }


@dataclass
class CostReport:
    start: datetime
    end: datetime
    by: tuple[str, ...]
    rows: list[CostRow] = field(default_factory=list)  # teams' and models', most cost first
    idle: list[CostRow] = field(default_factory=list)  # by GPU class
    # Per currency: the rows and idle together, what the fleet's GPU-hours cost.
    totals: list[CostRow] = field(default_factory=list)
    # GPUs (names; "" CPU-only nodes) with hours and no price for some of the period:
    # those hours cost 0.
    unpriced: list[str] = field(default_factory=list)
    peaks: dict[str, float] = field(default_factory=dict)  # model -> tokens per GPU-hour


def report(start: datetime, end: datetime, by=("team", "model"), within=None) -> CostReport:
    """The period's cost by ``by`` (any of "team", "model", "gpu_class"), idle apart.
    ``within`` (a Q) narrows the rows to those a caller may see (services.cost_scope):
    the totals are then of those alone."""
    by = tuple(by)
    if bad := [b for b in by if b not in BY]:
        raise ValueError(f"cannot report costs by {', '.join(bad)}: by is any of {', '.join(BY)}")
    first, last = hour_of(start), hour_of(end)
    if last < end:
        last += HOUR
    out = CostReport(first, last, by)
    out.peaks = peaks(last, first)
    groups: dict[tuple, CostRow] = {}
    seen: dict[str, datetime] = {}  # GPU -> the first hour it held anything
    totals: dict[str, CostRow] = {}
    for idle, team, model, gpu, currency, secs, cost, tokens, since in (
        _rows(first, last, within)
        .order_by()
        .values("idle", "team_name", "model_name", "gpu_class", "currency")
        .annotate(
            s=Sum("gpu_seconds"),
            c=Sum("cost"),
            t=Sum("tokens"),
            since=Min("hour", filter=Q(gpu_seconds__gt=0)),
        )
        .values_list(
            "idle", "team_name", "model_name", "gpu_class", "currency", "s", "c", "t", "since"
        )
    ):
        hours, cost, tokens = (secs or 0.0) / 3600, cost or Decimal(0), tokens or 0
        if since is not None and (gpu not in seen or since < seen[gpu]):
            seen[gpu] = since
        if idle:
            key = (True, None, None, gpu, currency)
            row = groups.get(key) or CostRow(None, None, gpu, True, currency)
        else:
            key = (
                False,
                team if "team" in by else None,
                model if "model" in by else None,
                gpu if "gpu_class" in by else None,
                currency,
            )
            row = groups.get(key) or CostRow(*key[1:4], False, currency)
        groups[key] = row
        total = totals.setdefault(currency, CostRow(currency=currency))
        for r in (row, total):
            r.gpu_hours += hours
            r.cost += cost
            r.tokens += tokens
        peak = out.peaks.get(model)
        if not idle and peak:
            row.capacity_tokens += hours * peak
            row.served_at_peak += tokens
    rows = sorted(groups.values(), key=lambda r: (-r.cost, -r.gpu_hours, _name(r)))
    out.rows = [r for r in rows if not r.idle]
    out.idle = [r for r in rows if r.idle]
    out.totals = [totals[c] for c in sorted(totals)]
    price_list = prices.facts()
    # A class once priced stays priced: none at the first hour it held anything is some
    # hours without.
    out.unpriced = sorted(g for g, h in seen.items() if prices.pick(g, price_list, h) is None)
    return out


def _rows(first: datetime, last: datetime, within=None):
    rows = CostHour.objects.filter(hour__gte=first, hour__lt=last)
    return rows if within is None else rows.filter(within)


def _name(r: CostRow) -> tuple:
    return (r.team or "", r.model or "", r.gpu_class or "")


def peaks(end: datetime, start: datetime | None = None) -> dict[str, float]:
    """Each model's most tokens per GPU-hour in one closed hour (see the module's docstring)."""
    since = end - PEAK_WINDOW
    if start is not None:
        since = min(since, start)
    per_hour = Cast("tokens", FloatField()) * 3600.0 / F("gpu_seconds")
    return {
        model: peak
        for model, peak in CostHour.objects.filter(
            hour__gte=since,
            hour__lt=end,
            closed=True,
            idle=False,
            tokens__gt=0,
            gpu_seconds__gte=PEAK_MIN_GPU_S,
        )
        .order_by()
        .values("model_name")
        .annotate(peak=Max(per_hour, output_field=FloatField()))
        .values_list("model_name", "peak")
        if peak
    }


def series(start: datetime, end: datetime, by: str = "team", within=None) -> list[dict]:
    """The period hour by hour, for a chart: one point per hour, ``by`` ("team" or "model")
    and currency, idle as its own line (``idle`` true, name None). One query. ``within``
    as for ``report``."""
    if by not in ("team", "model"):
        raise ValueError(f"a cost chart is by team or model, not {by!r}")
    first, last = hour_of(start), hour_of(end)
    if last < end:
        last += HOUR
    name = f"{by}_name"
    points: dict[tuple, dict] = {}
    for hour, idle, who, currency, secs, cost in (
        _rows(first, last, within)
        .order_by()
        .values("hour", "idle", name, "currency")
        .annotate(s=Sum("gpu_seconds"), c=Sum("cost"))
        .values_list("hour", "idle", name, "currency", "s", "c")
    ):
        key = (hour, idle, None if idle else who, currency)
        p = points.setdefault(
            key,
            {
                "hour": hour,
                "idle": idle,
                by: key[2],
                "currency": currency,
                "gpu_hours": 0.0,
                "cost": Decimal(0),
            },
        )
        p["gpu_hours"] += (secs or 0.0) / 3600
        p["cost"] += cost or Decimal(0)
    return sorted(points.values(), key=lambda p: (p["hour"], p["idle"], p[by] or ""))
