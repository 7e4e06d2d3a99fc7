"""The cost page: the day of tests/costs/surfaces.py by team and model, its chart a bar a
day stacked per team with the idle apart, budgets, the period chooser, and a member of
one team seeing that team's costs only; in a fixed number of queries."""

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from fleet.models import CostHour, Team
from fleet.services.console import costs as console_costs
from tests.costs.surfaces import DAY, a_day
from tests.factories import grant, operator, staff_user

pytestmark = pytest.mark.django_db

COSTS = reverse("console:costs")
THE_DAY = {"from": "2026-11-03", "to": "2026-11-03"}


def row(html: str, attrs: str) -> str:
    """The table row whose attributes begin with ``attrs`` (e.g. 'data-team="research"')."""
    return html.split(attrs, 1)[1].split("</tr>", 1)[0]


def cells(html: str) -> dict[str, str]:
    """A row's cells by class, their text with tags and spaces squeezed."""
    out = {}
    for cls, text in re.findall(r'<td class="([\w-]+)[^"]*">(.*?)</td>', html, re.S):
        out[cls] = " ".join(re.sub(r"<[^>]+>", " ", text).split())
    return out


def test_the_day_by_team_and_model_with_the_idle_apart(client):
    a_day()
    client.force_login(operator())

    page = client.get(COSTS, THE_DAY).content.decode()

    assert 'data-period="custom"' in page
    assert cells(row(page, 'class="team-row" data-team="research"')) == {
        "team": "research", "gpu-hours": "96.0", "cost": "240.00 EUR", "tokens": "60,000,000",
        "per-million": "4.00 EUR", "utilisation": "83%", "budget": "-",
    }  # fmt: skip
    assert cells(row(page, 'class="team-row" data-team="vision"'))["cost"] == "60.00 EUR"
    model = cells(row(page, 'class="model-row" data-team="vision" data-model="vit-l"'))
    assert (model["per-million"], model["utilisation"]) == ("2.50 EUR", "100%")
    assert cells(row(page, 'class="idle-row" data-gpu="NVIDIA H100 80GB HBM3"')) == {
        "gpu": "NVIDIA H100 80GB HBM3", "gpu-hours": "72.0", "cost": "180.00 EUR"}  # fmt: skip
    totals = page.split('id="costs-totals"', 1)[1].split('id="costs-charts"', 1)[0]
    assert "480.00 EUR" in totals and "192.0 GPU-hours" in totals and "38% idle" in totals
    # the CSV of the same period, through the API
    assert "/api/v1/costs/?start=2026-11-03T00%3A00%3A00%2B00%3A00" in page
    assert "format=csv" in page


def test_the_chart_is_a_bar_a_day_stacked_per_team_with_the_idle_on_top(client):
    a_day()
    a_day_more = DAY + timedelta(days=1)
    CostHour.objects.create(hour=a_day_more, idle=True, gpu_class="NVIDIA H100 80GB HBM3",
                            gpu_seconds=8 * 3600, cost=Decimal(20), currency="EUR",
                            closed=True)  # fmt: skip
    client.force_login(operator())

    page = client.get(COSTS, {"from": "2026-11-03", "to": "2026-11-04"}).content.decode()

    figure = page.split('id="chart-cost-EUR"', 1)[1].split("</figure>", 1)[0]
    segments = re.findall(
        r'<rect class="segment( idle)?" data-series="([^"]*)" data-day="([^"]*)" '
        r'data-cost="([^"]*)" x="[^"]*" y="([^"]*)"',
        figure,
    )
    assert [(s, d, c) for _, s, d, c, _ in segments] == [
        ("research", "2026-11-03", "240.00"),
        ("vision", "2026-11-03", "60.00"),
        ("idle", "2026-11-03", "180.00"),
        ("idle", "2026-11-04", "20.00"),
    ]
    ys = [float(y) for *_, y in segments[:3]]
    assert ys[0] > ys[1] > ys[2], "stacked upwards: research at the bottom, the idle on top"
    assert [i for i, *_ in segments] == ["", "", " idle", " idle"]
    assert "idle (no replica)" in figure and "500.00 EUR" not in figure


def test_a_member_sees_their_team_only_and_no_idle(client):
    teams = a_day()
    alice = grant(staff_user("alice"), "fleet.view_costhour")
    alice.groups.add(teams["vision"].group)
    client.force_login(alice)

    page = client.get(COSTS, THE_DAY).content.decode()

    assert "You see team &#x27;vision&#x27; only." in page
    assert 'data-team="vision"' in page
    assert "research" not in page and "llama-70b" not in page
    assert 'id="costs-idle"' not in page and "180.00" not in page
    totals = page.split('id="costs-totals"', 1)[1].split('id="costs-charts"', 1)[0]
    assert "60.00 EUR" in totals and "480.00" not in totals and "idle" not in totals


def test_the_page_needs_view_costhour_and_its_link_shows_only_with_it(client):
    client.force_login(grant(staff_user("viewer"), "fleet.view_node"))
    assert client.get(COSTS).status_code == 403
    assert 'id="nav-costs"' not in client.get(reverse("admin:index")).content.decode()

    client.force_login(grant(staff_user("payer"), "fleet.view_costhour"))
    assert client.get(COSTS).status_code == 200
    index = client.get(reverse("admin:index")).content.decode()
    assert f'id="nav-costs" href="{COSTS}"' in index


def test_a_team_s_budget_this_month_shows_beside_its_costs(client):
    teams = a_day()
    now = timezone.now()
    Team.objects.filter(pk=teams["research"].pk).update(
        budget_per_month=Decimal(250), budget_currency="EUR", budget_warn_percent=80,
        spent_this_month=Decimal(240), spent_updated_at=now)  # fmt: skip
    client.force_login(operator())

    page = client.get(COSTS, THE_DAY).content.decode()

    budget = row(page, 'class="team-row" data-team="research"')
    assert 'class="budget budget-warned"' in budget
    assert cells(budget)["budget"] == "240.00 of 250.00 EUR past 80%"


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"from": "2026-11-05", "to": "2026-11-01"}, "the period ends (2026-11-01) before it"),
        ({"from": "yesterday", "to": "2026-11-01"}, "&#x27;yesterday&#x27; is not a date"),
        ({"from": "2026-01-01", "to": "2026-12-31"}, "a period is at most 92 days"),
    ],
)
def test_a_bad_period_says_why_and_shows_this_month(client, query, said):
    client.force_login(operator())

    page = client.get(COSTS, query).content.decode()

    assert said in page and 'data-period="month"' in page


def test_the_named_periods():
    now = datetime(2026, 12, 6, 15, 30, tzinfo=UTC)

    def of(key):
        p = console_costs.period(key, now=now)
        return (p.start.isoformat(), p.end.isoformat())

    assert of("month") == ("2026-12-01T00:00:00+00:00", "2026-12-06T15:30:00+00:00")
    assert of("last-month") == ("2026-11-01T00:00:00+00:00", "2026-12-01T00:00:00+00:00")
    assert of("7d") == ("2026-11-30T00:00:00+00:00", "2026-12-06T15:30:00+00:00")
    assert of("nonsense") == of("month")


def more_teams(n: int) -> None:
    """``n`` teams more, each with a model that held a GPU every hour of the day."""
    from django.contrib.auth.models import Group

    from fleet.models import Model

    rows = []
    for i in range(n):
        t = Team.objects.create(name=f"team-{i}", group=Group.objects.create(name=f"team-{i}"))
        m = Model.objects.create(name=f"model-{i}", team=t)
        rows += [
            CostHour(hour=DAY + timedelta(hours=h), team=t, team_name=t.name, model=m,
                     model_name=m.name, gpu_class="NVIDIA H100 80GB HBM3", gpu_seconds=3600,
                     cost=Decimal("2.5"), currency="EUR", tokens=1000, closed=True)
            for h in range(24)
        ]  # fmt: skip
    CostHour.objects.bulk_create(rows)


def test_the_page_reads_in_a_fixed_number_of_queries_whatever_the_teams(client):
    a_day()
    client.force_login(operator())
    client.get(COSTS, THE_DAY)  # the session and the user, once

    with CaptureQueriesContext(connection) as two:
        client.get(COSTS, THE_DAY)
    more_teams(10)
    with CaptureQueriesContext(connection) as twelve:
        page = client.get(COSTS, THE_DAY).content.decode()

    assert page.count('class="team-row"') == 12
    assert len(twelve) == len(two)
    # the rows, the models' peaks, the prices, the teams' budgets, the chart's hours
    # (and every admin page's banner, fleet_fleetstatus, left out)
    fleet = [q["sql"] for q in two.captured_queries
             if '"fleet_' in q["sql"] and "fleet_fleetstatus" not in q["sql"]]  # fmt: skip
    assert len(fleet) == 5, fleet


def test_a_gpu_name_an_agent_sent_is_shown_as_text(client):
    CostHour.objects.create(hour=DAY, idle=True, gpu_class='<img src=x onerror="alert(1)">',
                            gpu_seconds=3600, cost=Decimal(1), currency="EUR",
                            closed=True)  # fmt: skip
    client.force_login(operator())

    page = client.get(COSTS, THE_DAY).content.decode()

    assert "<img src=x" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


def test_hours_nobody_priced_are_named_cpu_only_nodes_where_the_class_is_empty(client):
    # `make run`'s fleet: one node without GPUs, and no price set for any class
    for gpu_class in ("", "NVIDIA A10"):
        CostHour.objects.create(hour=DAY, idle=True, gpu_class=gpu_class, gpu_seconds=3600,
                                cost=Decimal(0), currency="USD", closed=True)  # fmt: skip
    client.force_login(operator())

    page = client.get(COSTS, THE_DAY).content.decode()

    note = page.split('id="costs-unpriced"', 1)[1].split("</p>", 1)[0]
    assert "No price for CPU-only nodes, NVIDIA A10: their hours are costed at 0" in note
