"""The cost page: a period's cost by team and by model, a day-by-day chart stacked per team
with the idle apart, and each team's budget this month.

Everything comes from ``costs.report`` and ``costs.series`` (the CostHour rows,
never the replicas' history), narrowed to what the operator may see
(``services.cost_scope``): five queries (the rows, the models' peaks, the prices,
the teams' budgets, the chart's hours) whatever the fleet's size or the number of
teams (tests/console/test_costs.py counts them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.utils import timezone
from django.utils.dateparse import parse_date

from fleet.models import Team

from .. import cost_scope, costs
from ..costs.budgets import Budget, month_start

# The period chooser: key -> words. "custom" is from/to dates.
PERIODS = {
    "month": "this month",
    "last-month": "last month",
    "7d": "the last 7 days",
    "30d": "the last 30 days",
}
DEFAULT_PERIOD = "month"
# The chart is a bar a day; a longer period is still one bar a day, up to this many.
MAX_DAYS = 92
IDLE = "idle"


class PeriodError(ValueError):
    """A period the chooser cannot show: what was wrong, for the page."""


@dataclass
class Period:
    key: str  # one of PERIODS, or "custom"
    start: datetime
    end: datetime

    @property
    def words(self) -> str:
        if self.key in PERIODS:
            return PERIODS[self.key]
        if self.first_day == self.last_day:
            return f"{self.first_day:%Y-%m-%d}"
        return f"{self.first_day:%Y-%m-%d} to {self.last_day:%Y-%m-%d}"

    @property
    def first_day(self) -> date:
        return self.start.date()

    @property
    def last_day(self) -> date:
        return (self.end - timedelta(seconds=1)).date()


def period(key: str = "", start: str = "", end: str = "", now: datetime | None = None) -> Period:
    """The period chosen: a named one, or from ``start`` to ``end`` (dates, both days
    included). PeriodError saying what is wrong with the dates."""
    now = (now or timezone.now()).astimezone(UTC)
    today = datetime.combine(now.date(), time.min, tzinfo=UTC)
    if start or end or key == "custom":
        first, last = _day(start, "from"), _day(end, "to")
        if last < first:
            raise PeriodError(f"the period ends ({last}) before it begins ({first})")
        if (last - first).days >= MAX_DAYS:
            raise PeriodError(f"a period is at most {MAX_DAYS} days; {first} to {last} is more")
        begin = datetime.combine(first, time.min, tzinfo=UTC)
        return Period("custom", begin, datetime.combine(last, time.min, tzinfo=UTC) + _DAY)
    key = key if key in PERIODS else DEFAULT_PERIOD
    this_month = month_start(now)
    if key == "last-month":
        return Period(key, month_start(this_month - _DAY), this_month)
    if key == "7d":
        return Period(key, today - 6 * _DAY, now)
    if key == "30d":
        return Period(key, today - 29 * _DAY, now)
    return Period(key, this_month, now)


_DAY = timedelta(days=1)


def _day(text: str, which: str) -> date:
    try:
        found = parse_date((text or "").strip())
    except ValueError:
        found = None
    if found is None:
        raise PeriodError(f"'{text}' is not a date for '{which}': give it as 2026-11-01")
    return found


@dataclass
class TeamLine:
    """A team's cost over the period, and its budget this month."""

    row: costs.CostRow
    budget: Budget | None  # None: the team is gone, or shows no budget


@dataclass
class DayStack:
    """One day's bar: the cost of each team (in the chart's order), then the idle."""

    day: date
    parts: list[tuple[str, Decimal]]  # (team, or IDLE; cost)

    @property
    def total(self) -> Decimal:
        return sum((c for _, c in self.parts), Decimal(0))


@dataclass
class CostChart:
    """A bar a day, stacked per team with the idle on top, in one currency."""

    currency: str
    days: list[DayStack]
    series: list[str]  # the teams in stacking order (most cost first), then IDLE if shown

    @property
    def points(self) -> int:
        return sum(1 for d in self.days for _, c in d.parts if c)


@dataclass
class CostPage:
    period: Period
    seen: cost_scope.Seen
    teams: list[TeamLine]
    models: list[costs.CostRow]
    idle: list[costs.CostRow]
    totals: list[costs.CostRow]
    unpriced: list[str]
    charts: list[CostChart] = field(default_factory=list)
    at: datetime = field(default_factory=timezone.now)

    @property
    def idle_share(self) -> dict[str, float]:
        """Per currency: the share of the cost shown that no replica held."""
        out = {}
        for t in self.totals:
            idle = sum((i.cost for i in self.idle if i.currency == t.currency), Decimal(0))
            out[t.currency] = float(idle / t.cost) if t.cost else 0.0
        return out


def cost_page(user, chosen: Period) -> CostPage:
    seen = cost_scope.seen_by(user)
    found = costs.report(chosen.start, chosen.end, ("team", "model"), within=seen.within)
    page = CostPage(
        period=chosen,
        seen=seen,
        teams=_teams(found.rows, seen),
        models=found.rows,
        idle=found.idle if seen.idle else [],
        totals=found.totals,
        unpriced=found.unpriced if seen.idle else [],
    )
    page.charts = _charts(chosen, seen, [t.row.team for t in page.teams])
    return page


def _teams(rows: list[costs.CostRow], seen: cost_scope.Seen) -> list[TeamLine]:
    """The model rows summed by team (utilisation too: its parts add), with each team's
    budget this month."""
    by_team: dict[tuple[str, str], costs.CostRow] = {}
    for r in rows:
        t = by_team.setdefault(
            (r.team, r.currency), costs.CostRow(team=r.team, currency=r.currency)
        )
        t.gpu_hours += r.gpu_hours
        t.cost += r.cost
        t.tokens += r.tokens
        t.capacity_tokens += r.capacity_tokens
        t.served_at_peak += r.served_at_peak
    names = {t for t, _ in by_team}
    month = month_start(timezone.now())
    budgets = {
        name: Budget(name, b, c, w, s if at and at >= month else Decimal(0))
        for name, b, c, w, s, at in Team.objects.filter(name__in=names).values_list(
            "name",
            "budget_per_month",
            "budget_currency",
            "budget_warn_percent",
            "spent_this_month",
            "spent_updated_at",
        )
    }
    lines = [TeamLine(r, budgets.get(r.team)) for r in by_team.values()]
    return sorted(lines, key=lambda t: (-t.row.cost, t.row.team or ""))


def _charts(chosen: Period, seen: cost_scope.Seen, order: list[str]) -> list[CostChart]:
    points = costs.series(chosen.start, chosen.end, "team", within=seen.within)
    days = [
        chosen.first_day + timedelta(days=i)
        for i in range((chosen.last_day - chosen.first_day).days + 1)
    ]
    per: dict[str, dict[tuple[date, str], Decimal]] = {}
    for p in points:
        who = IDLE if p["idle"] else p["team"]
        cell = per.setdefault(p["currency"], {})
        key = (p["hour"].astimezone(UTC).date(), who)
        cell[key] = cell.get(key, Decimal(0)) + p["cost"]
    charts = []
    for currency, cells in sorted(per.items()):
        present = {who for _, who in cells}
        series = [t for t in dict.fromkeys(order) if t in present]
        series += sorted(present - set(series) - {IDLE})
        if IDLE in present:
            series.append(IDLE)  # on top, apart: nobody's
        stacks = [
            DayStack(d, [(who, cells.get((d, who), Decimal(0))) for who in series]) for d in days
        ]
        charts.append(CostChart(currency, stacks, series))
    return charts
