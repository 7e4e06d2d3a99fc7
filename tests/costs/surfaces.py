"""The day the cost surfaces' tests (API, llmgw, console, browser, metrics) all show, and
docs/operations.md's worked example: one node of 8 H100s at 2.50 EUR an hour.

- team research's llama-70b holds 4 GPUs all day: 96 GPU-hours, 240.00 EUR; it
  serves 3M tokens an hour for 12 hours, then 2M: 60M tokens, 4.00 EUR per
  million. Its peak is 750k tokens per GPU-hour, so it used 60M of the 72M its
  GPU-hours could have served: 83%.
- team vision's vit-l holds 2 GPUs for the first 12 hours: 24 GPU-hours, 60.00 EUR;
  2M tokens an hour, 24M tokens, 2.50 EUR per million, at its peak all along: 100%.
- the rest is idle: 2 GPUs for 12 hours and 4 for 12, 72 GPU-hours, 180.00 EUR.

The whole node: 192 GPU-hours, 480.00 EUR = 240 + 60 + 180.

The rows are written as the accrual would have closed them (tests/costs/ test the
accrual itself), so these tests are about what each surface shows.
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.contrib.auth.models import Group

from fleet.models import CostHour, Model, Price, Team

H100 = "NVIDIA H100 80GB HBM3"
DAY = datetime(2026, 11, 3, tzinfo=UTC)
PRICE = Decimal("2.50")


def a_day(day: datetime = DAY) -> dict:
    """The teams, models, price and 24 closed hours of the day above; returns the teams."""
    research = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    vision = Team.objects.create(name="vision", group=Group.objects.create(name="vision"))
    llama = Model.objects.create(name="llama-70b", team=research)
    vit = Model.objects.create(name="vit-l", team=vision)
    Price.objects.create(gpu_class="H100", per_hour=PRICE, currency="EUR", effective_from=DAY)
    rows = []
    for h in range(24):
        hour = day + timedelta(hours=h)
        morning = h < 12
        held = {llama: (4, 3_000_000 if morning else 2_000_000)}
        if morning:
            held[vit] = (2, 2_000_000)
        for model, (gpus, tokens) in held.items():
            rows.append(_row(hour, gpus, tokens, model=model))
        rows.append(_row(hour, 8 - sum(g for g, _ in held.values()), 0))
    CostHour.objects.bulk_create(rows)
    return {"research": research, "vision": vision}


def _row(hour, gpus: int, tokens: int, model: Model | None = None) -> CostHour:
    return CostHour(
        hour=hour,
        team=model.team if model else None,
        team_name=model.team.name if model else "",
        model=model,
        model_name=model.name if model else "",
        idle=model is None,
        gpu_class=H100,
        gpu_seconds=gpus * 3600.0,
        cost=PRICE * gpus,
        currency="EUR",
        tokens=tokens,
        closed=True,
    )


def period(day: datetime = DAY) -> dict:
    """The query for that day."""
    return {"start": day.date().isoformat(), "end": (day + timedelta(days=1)).date().isoformat()}
