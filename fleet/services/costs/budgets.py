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

from django.db.models import Q, Sum

from fleet.models import CostHour, Event, EventKind, Team

from .. import doorbells

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
    """Bring every team's spending this month up to date, and say what it passed."""
    start = month_start(now)
    sums = {
        (team_id, currency): total or Decimal(0)
        for team_id, currency, total in CostHour.objects.filter(hour__gte=start, team__isnull=False)
        .order_by()
        .values("team_id", "currency")
        .annotate(total=Sum("cost"))
        .values_list("team_id", "currency", "total")
    }
    teams = list(
        Team.objects.only(
            "id",
            "name",
            "budget_per_month",
            "budget_currency",
            "budget_warn_percent",
            "budget_warned_at",
            "budget_spent_at",
        )
    )
    out, flipped = [], False
    for team in teams:
        team.spent_this_month = Decimal(sums.get((team.pk, team.budget_currency), 0)).quantize(
            Decimal("0.000001")
        )
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
    Team.objects.bulk_update(teams, ["spent_this_month", "spent_updated_at"])
    if flipped:
        # The gateways reload their keys every few seconds anyway; this is at once.
        doorbells.ring_gateways("keys")
    return out


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
