"""A team's budget in money, through a real gateway (docs/operations.md, "What the fleet
costs"): once the cost accrual counts it spent, its keys get 429 ``insufficient_quota``
naming the team and its budget, other teams' keys are served, and raising the budget
serves it again. The gateway learns it from the keys it reloads: no request reads the
database."""

import json
from datetime import UTC, datetime
from decimal import Decimal

import openai
import pytest
from django.contrib.auth.models import Group

from fleet.gateway import keys
from fleet.gateway.errors import GatewayError
from fleet.models import ApiKey, CostHour, Team
from fleet.services.costs import budgets
from fleet.services.costs.accrual import hour_of
from tests.factories import inference_key, ready_model
from tests.gateway.live import client, post, wait_until

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def ask(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def team(name: str, **fields) -> Team:
    return Team.objects.create(name=name, group=Group.objects.create(name=name), **fields)


def spent(owner: Team, amount: str, now: datetime) -> None:
    """The accrual counted ``amount`` of the team's this month, and brought it up to date."""
    CostHour.objects.create(
        hour=hour_of(now),
        team=owner,
        team_name=owner.name,
        model_name="tiny",
        gpu_class="NVIDIA H100 80GB HBM3",
        gpu_seconds=3600.0,
        cost=Decimal(amount),
        currency="USD",
    )
    budgets.spend(now)


def test_a_spent_team_s_keys_are_refused_and_served_again_once_it_is_raised(
    gateway_server, upstreams
):
    # given: research with a budget of 10.00 USD a month, vision with none
    engine = upstreams("tiny")
    ready_model("tiny", [engine])
    research = team("research", budget_per_month=Decimal("10"), budget_currency="USD")
    vision = team("vision")
    _, ours = inference_key("ours", team=research)
    _, theirs = inference_key("theirs", team=vision)
    assert post(gateway_server, "/v1/chat/completions", ask("tiny"), ours)[0] == 200

    # when: the accrual counts 10.50 USD of its GPU-hours this month
    spent(research, "10.50", datetime.now(UTC))

    # then: its keys are refused, naming the team and its budget; vision's are served
    def refused():
        status, headers, body = post(gateway_server, "/v1/chat/completions", ask("tiny"), ours)
        return (status, headers, body) if status == 429 else None

    status, headers, body = wait_until(refused, what="research's key refused")
    error = json.loads(body)["error"]
    assert error["code"] == "insufficient_quota"
    assert error["message"].startswith(
        "team 'research' has spent its budget of 10.00 USD for this month (UTC): "
        "10.50 USD so far; try again in "
    )
    assert int(headers["retry-after"]) > 0
    assert post(gateway_server, "/v1/chat/completions", ask("tiny"), theirs)[0] == 200
    with pytest.raises(openai.RateLimitError) as seen:
        client(gateway_server, ours).chat.completions.create(
            model="tiny", messages=ask("tiny")["messages"]
        )
    assert seen.value.code == "insufficient_quota"
    served = len(engine.requests)

    # when: an operator raises the budget
    research.budget_per_month = Decimal("20")
    research.save()

    # then: served again
    wait_until(
        lambda: post(gateway_server, "/v1/chat/completions", ask("tiny"), ours)[0] == 200,
        what="research's key served again",
    )
    assert len(engine.requests) == served + 1  # research's, once raised


def test_a_budget_spent_last_month_refuses_nothing_this_month(transactional_db):
    research = team("research", budget_per_month=Decimal("10"))
    key, _ = inference_key("ours", team=research)
    Team.objects.filter(pk=research.pk).update(
        spent_this_month=Decimal("12"), spent_updated_at=datetime(2026, 11, 30, 23, 59, tzinfo=UTC)
    )
    digest = ApiKey.objects.get(pk=key.pk).secret_hash
    entry = keys.load_keys()[digest]
    assert entry.spent.startswith("team 'research' has spent its budget of 10.00 USD")
    with pytest.raises(GatewayError) as refused:
        keys.check_budget(entry, datetime(2026, 11, 30, 23, 59, 30, tzinfo=UTC).timestamp())
    assert (refused.value.status, refused.value.code) == (429, "insufficient_quota")
    assert refused.value.retry_after == 30
    # a new month: not counted yet, and not refused
    keys.check_budget(entry, datetime(2026, 12, 1, 0, 0, 30, tzinfo=UTC).timestamp())
