"""Teams' budgets in money: what each spent this UTC month, its warning and its refusal.

The accrual (``accrue``) calls ``spend`` after each count: one sum over the
month's CostHour rows per team and currency, one bulk write of every team's
``spent_this_month``, and an event (kind "budget") the first time in a month a
team passes its warning threshold and the first time it spends its budget. Only
costs in the budget's currency count: prices in another are never converted.

The gateway refuses a spent team's keys from what it reloads with them
(fleet.gateway.keys: ``spent_this_month`` against ``budget_per_month``, while
``spent_updated_at`` is in the current month), so no request reads the
database; a budget raised is seen at the next reload, a new month at the next
count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db.models import Min, Q, Sum

from fleet.models import CostHour, Event, EventKind, Team

from .. import doorbells

# "closed IN (false)", not the ORM's "NOT closed", which SQLite's planner cannot take
# the (closed, hour) index for: it read every hour ever counted, on every count.
OPEN = [False]

logger = logging.getLogger(__name__)


def month_start(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def money(amount: Decimal, currency: str) -> str:
    return f"{amount.quantize(Decimal('0.01'))} {currency}"


@dataclass(frozen=True)
class Budget:
    """A team's budget as the gateway and the pages judge it."""

    team: str
    budget: Decimal | None
    currency: str
    warn_percent: int
    spent: Decimal

    @property
    def warn_at(self) -> Decimal | None:
        if self.budget is None:
            return None
        return self.budget * self.warn_percent / 100

    @property
    def state(self) -> str:
        """ "none" (no budget), "ok", "warned" or "spent"."""
        if self.budget is None:
            return "none"
        if self.spent >= self.budget:
            return "spent"
        return "warned" if self.spent >= self.warn_at else "ok"


def spent_refusal(team: str, budget: Decimal, currency: str, spent: Decimal) -> str:
    """What the gateway answers a spent team's keys (before "try again in ...")."""
    return (
        f"team '{team}' has spent its budget of {money(budget, currency)} for this month "
        f"(UTC): {money(spent, currency)} so far"
    )


def spend(now: datetime) -> list[Budget]:
    """Bring every team's spending this month up to date, and say what it passed.

    Summing the whole month on every count read the month's rows each minute
    (144,000 of them by its end with 200 models): the rows before the first open
    hour change only when a price is set, so their sum is kept on the team
    (``spent_closed``, with the hour and currency it was summed to) and taken
    again only when that hour moves on, once an hour; each count sums the open
    hours alone.
    """
    start = month_start(now)
    first_open = CostHour.objects.filter(closed__in=OPEN, hour__gte=start).aggregate(h=Min("hour"))[
        "h"
    ] or now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    teams = list(
        Team.objects.only(
            "id",
            "name",
            "budget_per_month",
            "budget_currency",
            "budget_warn_percent",
            "budget_warned_at",
            "budget_spent_at",
            "spent_closed",
            "spent_closed_key",
        )
    )
    stale = [t for t in teams if t.spent_closed_key != _key(first_open, t.budget_currency)]
    if stale:
        closed = _sums(hour__gte=start, hour__lt=first_open)
        for team in stale:
            team.spent_closed = closed.get((team.pk, team.budget_currency), Decimal(0))
            team.spent_closed_key = _key(first_open, team.budget_currency)
    still_open = _sums(hour__gte=max(start, first_open))
    out, flipped = [], False
    for team in teams:
        spent = team.spent_closed + still_open.get((team.pk, team.budget_currency), Decimal(0))
        team.spent_this_month = spent.quantize(Decimal("0.000001"))
        team.spent_updated_at = now
        b = Budget(
            team.name,
            team.budget_per_month,
            team.budget_currency,
            team.budget_warn_percent,
            team.spent_this_month,
        )
        out.append(b)
        flipped |= _passed(team, b, start, now)
    # A bulk write: no save(), so no audit entry for what the system keeps up.
    fields = ["spent_this_month", "spent_updated_at"]
    if stale:
        fields += ["spent_closed", "spent_closed_key"]
    Team.objects.bulk_update(teams, fields)
    if flipped:
        # The gateways reload their keys every few seconds anyway; this is at once.
        doorbells.ring_gateways("keys")
    return out


def forget_closed() -> None:
    """The closed hours' sums to be taken again at the next count: their prices changed."""
    Team.objects.update(spent_closed_key="")


def _key(first_open: datetime, currency: str) -> str:
    return f"{first_open:%Y-%m-%dT%H}|{currency}"


def _sums(**hours) -> dict[tuple[int, str], Decimal]:
    """The teams' cost over those hours, by team and currency: one query."""
    # SQLite's planner, given "team_id IS NOT NULL" or a GROUP BY that starts with team_id,
    # takes the team index and reads every row ever counted; grouped by currency first,
    # it takes the hour index. Idle rows (no team) are summed too, and left out here.
    return {
        (team_id, currency): total or Decimal(0)
        for currency, team_id, total in CostHour.objects.filter(**hours)
        .order_by()
        .values("currency", "team_id")
        .annotate(total=Sum("cost"))
        .values_list("currency", "team_id", "total")
        if team_id is not None
    }


def _passed(team: Team, b: Budget, start: datetime, now: datetime) -> bool:
    """The month's first warning and first spending, each an event once (a conditional
    update says which count saw it first); both cleared when the team is back under
    (its budget raised, a price lowered). No statement when nothing changed. Returns
    whether its keys' refusal changed."""
    flipped = False
    mine = Team.objects.filter(pk=team.pk)
    warned = team.budget_warned_at is not None and team.budget_warned_at >= start
    spent = team.budget_spent_at is not None and team.budget_spent_at >= start
    unwarned = Q(budget_warned_at__isnull=True) | Q(budget_warned_at__lt=start)
    unspent = Q(budget_spent_at__isnull=True) | Q(budget_spent_at__lt=start)
    if b.state in ("warned", "spent") and not warned:
        if mine.filter(unwarned).update(budget_warned_at=now):
            _event(
                now,
                f"team '{b.team}' has spent {money(b.spent, b.currency)} of its budget of "
                f"{money(b.budget, b.currency)} for {start:%Y-%m}, past its warning at "
                f"{b.warn_percent}%",
            )
    if b.state == "spent" and not spent:
        if mine.filter(unspent).update(budget_spent_at=now):
            flipped = True
            _event(
                now,
                f"team '{b.team}' has spent its budget of {money(b.budget, b.currency)} for "
                f"{start:%Y-%m} ({money(b.spent, b.currency)}): its keys are refused until "
                "the month ends or the budget is raised",
            )
    if b.state in ("none", "ok") and warned:
        if mine.filter(budget_warned_at__gte=start).update(budget_warned_at=None):
            logger.info("costs: team %s is under its budget's warning again", b.team)
    if b.state != "spent" and spent:
        if mine.filter(budget_spent_at__gte=start).update(budget_spent_at=None):
            flipped = True
            logger.info("costs: team %s is under its budget again; its keys are served", b.team)
    return flipped


def _event(now: datetime, reason: str) -> None:
    Event.objects.create(created_at=now, kind=EventKind.BUDGET, model_name="", reason=reason)
    logger.warning("costs: %s", reason)
