"""``llmgw_cost_total{team,model,currency}`` and the teams' budget gauges on /metrics, read
from the cost hours and teams at each scrape."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleet import metrics
from fleet.models import Team
from tests.costs.surfaces import a_day

pytestmark = pytest.mark.django_db


def scrape(*names) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name in names:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_llmgw_cost_total_by_team_and_model_with_the_idle_as_no_model():
    a_day()

    got = scrape("llmgw_cost_total")

    def key(team, model):
        return ("llmgw_cost_total", (("currency", "EUR"), ("model", model), ("team", team)))

    assert got == {
        key("research", "llama-70b"): 240.0,
        key("vision", "vit-l"): 60.0,
        key("", ""): 180.0,
    }


def test_a_team_s_budget_its_spending_and_its_warning_are_gauges():
    teams = a_day()
    now = timezone.now()
    Team.objects.filter(pk=teams["research"].pk).update(
        budget_per_month=Decimal(1000), budget_currency="EUR", budget_warn_percent=20,
        spent_this_month=Decimal(240), spent_updated_at=now)  # fmt: skip
    # vision's spending was counted last month: nothing yet this month
    Team.objects.filter(pk=teams["vision"].pk).update(
        budget_per_month=Decimal(50), spent_this_month=Decimal(60),
        spent_updated_at=now - timedelta(days=40))  # fmt: skip

    got = scrape(
        "llmgw_team_spent_this_month",
        "llmgw_team_budget_per_month",
        "llmgw_team_budget_warning",
        "llmgw_team_budget_spent",
    )

    assert got == {
        ("llmgw_team_spent_this_month", (("currency", "EUR"), ("team", "research"))): 240.0,
        ("llmgw_team_spent_this_month", (("currency", "USD"), ("team", "vision"))): 0.0,
        ("llmgw_team_budget_per_month", (("currency", "EUR"), ("team", "research"))): 1000.0,
        ("llmgw_team_budget_per_month", (("currency", "USD"), ("team", "vision"))): 50.0,
        ("llmgw_team_budget_warning", (("team", "research"),)): 1.0,
        ("llmgw_team_budget_warning", (("team", "vision"),)): 0.0,
        ("llmgw_team_budget_spent", (("team", "research"),)): 0.0,
        ("llmgw_team_budget_spent", (("team", "vision"),)): 0.0,
    }
