"""What the fleet costs, over real processes (docs/operations.md, "What the fleet costs"):
two teams' fake-engine models on one node of H100s (the NVML double), Celery beat
counting every second, for a measured period. The teams' GPU-seconds are the period
times what each holds (a whole GPU, a share of one), the report agrees with the rows and
the prices, the tokens are the gateway's, and a team's budget in money stops its keys.
On both database paths: SQLite, and a PostgreSQL of the test's own."""

import json
import time
from decimal import Decimal

import pytest
import requests
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Sum

from fleet.models import CostHour, Event, EventKind, FleetStatus, KeyUsage, Model, Team
from fleet.services import costs
from fleet.services.costs.accrual import HOUR
from tests.e2e.test_gpu_faults import fake_model, gpu_node, serving
from tests.e2e.test_gpu_sharing import H100_MIB, shared_model
from tests.factories import inference_key

pytestmark = pytest.mark.django_db(transaction=True)

PRICE = Decimal("36.00")  # an H100-hour: a cent a second
SHARE = 40 * 1024 / H100_MIB  # a 40 GiB share of an "80GB" H100
PERIOD_S = 12.0


@pytest.fixture
def clock():
    return {
        "LLMGW_COST_INTERVAL_S": "1",
        "LLMGW_GATEWAY_USAGE_FLUSH_S": "0.3",
        "LLMGW_GATEWAY_KEYS_REFRESH_S": "0.5",
    }


def team(name: str) -> Team:
    return Team.objects.create(name=name, group=Group.objects.create(name=name))


def counted() -> tuple:
    """(until when, seconds per owner, the report of the last hours) read together, in one
    transaction, retried past a count in between."""
    while True:
        with transaction.atomic():
            until = FleetStatus.get().cost_accrued_at
            rows = {
                (idle, t, m): s
                for idle, t, m, s in CostHour.objects.order_by()
                .values("idle", "team_name", "model_name")
                .annotate(s=Sum("gpu_seconds"))
                .values_list("idle", "team_name", "model_name", "s")
            }
            if until is None:
                return None, rows, None
            report = costs.report(until - 2 * HOUR, until + HOUR)
        if FleetStatus.get().cost_accrued_at == until:
            return until, rows, report


def chat(stack, secret: str, model: str) -> requests.Response:
    return requests.post(
        f"{stack.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_two_teams_on_one_node_cost_what_they_hold_and_a_spent_budget_stops_keys(database, request):
    stack = request.getfixturevalue("stack" if database == "sqlite" else "stack_on_postgres")
    # given: a node of four H100s; research's alpha on a whole GPU, vision's beta on a
    # 40 GiB share of another; H100s at 36.00 an hour
    gpu_node(stack, "gpu-a", 4)
    research, vision = team("research"), team("vision")
    costs.set_price("H100", PRICE, "USD", None)
    fake_model(stack, "alpha", 1)
    shared_model(stack, "beta", 40)
    Model.objects.filter(name="alpha").update(team=research)
    Model.objects.filter(name="beta").update(team=vision)
    serving(stack, "alpha", 1)
    serving(stack, "beta", 1)
    _, ours = inference_key("research client", team=research)
    _, theirs = inference_key("vision client", team=vision)

    # when: beat counts for a measured period while both serve
    stack.wait(lambda: FleetStatus.get().cost_accrued_at is not None, "the first count")
    t0, before, _ = counted()
    wall = time.monotonic()
    for _ in range(3):
        assert chat(stack, ours, "alpha").status_code == 200
        assert chat(stack, theirs, "beta").status_code == 200
    time.sleep(PERIOD_S)
    t1, after, got = counted()
    wall = time.monotonic() - wall
    period = (t1 - t0).total_seconds()

    # then: the period counted is the time that passed (beat's ticks, within a couple)
    assert wall - 3 <= period <= wall + 1, (period, wall)

    def grew(owner):
        return after.get(owner, 0.0) - before.get(owner, 0.0)

    alpha = grew((False, "research", "alpha"))
    beta = grew((False, "vision", "beta"))
    idle = grew((True, "", ""))
    assert alpha == pytest.approx(period, rel=1e-6)
    assert beta == pytest.approx(period * SHARE, rel=1e-6)
    assert idle == pytest.approx(period * (4 - 1 - SHARE), rel=1e-6)

    # and the report agrees with the rows and the price, idle apart
    assert {("research", "alpha"), ("vision", "beta")} <= {(r.team, r.model) for r in got.rows}
    for r in got.rows:
        assert r.gpu_hours * 3600 == pytest.approx(after[(False, r.team, r.model)])
        assert r.cost == pytest.approx(Decimal(r.gpu_hours) * PRICE, abs=Decimal("0.0001"))
    [idle_row] = got.idle
    assert idle_row.gpu_hours * 3600 == pytest.approx(after[(True, "", "")])
    [fleet] = got.totals
    assert fleet.gpu_hours * 3600 == pytest.approx(sum(after.values()))
    assert fleet.cost == pytest.approx(Decimal(fleet.gpu_hours) * PRICE, abs=Decimal("0.0001"))
    assert got.unpriced == []

    # and the API (GET costs/, what the cost page and `llmgw costs` read) says the same as
    # the report of the same count (beat goes on counting: read again past a count between)
    def api_and_report():
        until, _, report = counted()
        start, end = (until - 2 * HOUR).isoformat(), (until + HOUR).isoformat()
        api = stack.api("get", "costs/", params={"start": start, "end": end})
        return FleetStatus.get().cost_accrued_at == until and (api, report)

    api, got = stack.wait(api_and_report, "the API and the report on one count", timeout=30)
    by_owner = {(r["team"], r["model"]): r for r in api["rows"]}
    for r in got.rows:
        shown = by_owner[(r.team, r.model)]
        assert shown["gpu_hours"] == pytest.approx(r.gpu_hours, rel=1e-6)
        assert Decimal(shown["cost"]) == pytest.approx(r.cost, abs=Decimal("0.000001"))
    [idle_row] = got.idle
    assert sum(r["gpu_hours"] for r in api["idle"]) == pytest.approx(idle_row.gpu_hours)

    # and the tokens are what the gateway counted for each model
    def tokens_counted():
        used = KeyUsage.objects.filter(model="alpha").aggregate(
            t=Sum("prompt_tokens") + Sum("completion_tokens")
        )["t"]
        mine = CostHour.objects.filter(model_name="alpha").aggregate(t=Sum("tokens"))["t"]
        return used and used == mine and used

    used = stack.wait(tokens_counted, "alpha's tokens in its cost rows", timeout=30)
    now = FleetStatus.get().cost_accrued_at
    got = costs.report(now - 2 * HOUR, now + HOUR)
    alpha_row = next(r for r in got.rows if r.model == "alpha")
    assert alpha_row.tokens == used
    assert alpha_row.cost_per_million_tokens == pytest.approx(
        alpha_row.cost * 1_000_000 / used, abs=Decimal("0.001")
    )

    # when: research's budget is a cent, less than it has spent already
    research.refresh_from_db()
    research.budget_per_month = Decimal("0.01")
    research.save()

    # then: the next count says so, and its keys get 429 naming the team; vision's serve
    stack.wait(
        lambda: Team.objects.get(pk=research.pk).budget_spent_at is not None,
        "research counted as spent",
        timeout=30,
    )
    # (a Response of a 4xx is falsy: waited for in a tuple)
    (refused,) = stack.wait(
        lambda: (r := chat(stack, ours, "alpha")).status_code == 429 and (r,),
        "research's key refused",
        timeout=30,
    )
    error = json.loads(refused.text)["error"]
    assert error["code"] == "insufficient_quota"
    assert error["message"].startswith("team 'research' has spent its budget of 0.01 USD")
    assert chat(stack, theirs, "beta").status_code == 200
    reasons = Event.objects.filter(kind=EventKind.BUDGET).values_list("reason", flat=True)
    assert any("team 'research' has spent its budget of 0.01 USD" in r for r in reasons)
