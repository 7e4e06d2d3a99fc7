"""Prices, team budgets and costs through the API: allowed, refused, bad input changing
nothing with a clear error; the costs report as JSON and CSV, narrowed to the teams a
caller is in (tests/costs/surfaces.py has the day they show)."""

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from fleet.models import Price, Team
from fleet.services import permissions
from tests.costs.surfaces import a_day, period
from tests.factories import grant, operator, staff_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def as_user(client, user):
    client.force_login(user)
    return client


def post(client, path, body):
    return client.post(path, json.dumps(body), content_type="application/json")


def patch(client, path, body):
    return client.patch(path, json.dumps(body), content_type="application/json")


# ---- prices ------------------------------------------------------------------------------


def test_a_price_change_is_a_new_price_from_its_date_with_the_old_one_kept(client):
    as_user(client, operator())
    now = timezone.now()
    old_from, new_from = now - timedelta(days=30), now - timedelta(days=1)

    first = post(client, "/api/v1/prices/", {"gpu_class": "H100", "per_hour": "2.50",
                                             "currency": "EUR",
                                             "effective_from": old_from.isoformat()})  # fmt: skip
    second = post(client, "/api/v1/prices/", {"gpu_class": "H100", "per_hour": "2.8",
                                              "currency": "EUR",
                                              "effective_from": new_from.isoformat()})  # fmt: skip

    assert (first.status_code, second.status_code) == (201, 201), second.json()
    assert second.json()["per_hour"] == "2.8000" and second.json()["in_force"] is True
    listed = client.get("/api/v1/prices/?gpu_class=H100").json()["results"]
    assert [(p["per_hour"], p["in_force"]) for p in listed] == [("2.8000", True),
                                                                ("2.5000", False)]  # fmt: skip
    assert Price.objects.count() == 2


def test_a_price_dated_by_a_day_applies_from_its_midnight_utc_in_the_fleet_currency(client):
    as_user(client, operator())

    made = post(client, "/api/v1/prices/", {"gpu_class": "", "per_hour": "0.40",
                                            "effective_from": "2026-11-01"})  # fmt: skip

    assert made.status_code == 201, made.json()
    price = Price.objects.get()
    assert price.effective_from.isoformat() == "2026-11-01T00:00:00+00:00"
    assert (price.gpu_class, price.currency) == ("", "USD")


def test_setting_a_price_needs_add_price_and_the_refusal_changes_nothing(client):
    viewer = grant(staff_user("viewer"), "fleet.view_price")
    as_user(client, viewer)

    refused = post(client, "/api/v1/prices/", {"gpu_class": "H100", "per_hour": "1",
                                               "effective_from": "2026-11-01"})  # fmt: skip

    assert refused.status_code == 403
    assert client.get("/api/v1/prices/").status_code == 200
    assert not Price.objects.exists()
    # and the one permission the table names lets it through
    as_user(client, grant(viewer, *permissions.needs("price.set")))
    allowed = post(client, "/api/v1/prices/", {"gpu_class": "H100", "per_hour": "1",
                                               "effective_from": "2026-11-01"})  # fmt: skip
    assert allowed.status_code == 201


@pytest.mark.parametrize(
    ("body", "field", "said"),
    [
        ({"per_hour": "-1"}, "per_hour", "greater than or equal to 0"),
        ({"per_hour": "lots"}, "per_hour", "valid number"),
        ({"per_hour": 2.5}, "per_hour", "valid number"),  # an amount is text, as answered
        ({"currency": "eur"}, "currency", "three capital letters"),
        ({"effective_from": "soon"}, "effective_from", "format"),
        ({"gpu_class": 100}, "gpu_class", "valid string"),
    ],
)
def test_a_bad_price_is_refused_by_its_field_and_nothing_is_set(client, body, field, said):
    as_user(client, operator())
    good = {"gpu_class": "H100", "per_hour": "2.50", "effective_from": "2026-11-01"}

    answer = post(client, "/api/v1/prices/", {**good, **body})

    assert answer.status_code == 400
    assert said in " ".join(answer.json()[field]), answer.json()
    assert not Price.objects.exists()


def test_a_price_is_never_edited_or_deleted_through_the_api(client):
    as_user(client, operator())
    price = Price.objects.create(gpu_class="H100", per_hour=1, effective_from=timezone.now())

    assert patch(client, f"/api/v1/prices/{price.pk}/", {"per_hour": "9"}).status_code == 405
    assert client.delete(f"/api/v1/prices/{price.pk}/").status_code == 405
    assert Price.objects.get().per_hour == 1


# ---- a team's budget ---------------------------------------------------------------------


def test_a_team_budget_is_set_with_change_team_and_what_it_spent_is_read_only(client):
    research = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    as_user(client, grant(staff_user("lead"), "fleet.view_team", "fleet.change_team"))

    answer = patch(client, f"/api/v1/teams/{research.pk}/", {
        "budget_per_month": "1000", "budget_currency": "EUR", "budget_warn_percent": 90,
        "spent_this_month": "0.5"})  # fmt: skip

    assert answer.status_code == 200, answer.json()
    assert answer.json()["budget_per_month"] == "1000.00"
    assert answer.json()["spent_this_month"] == "0.000000"
    research.refresh_from_db()
    assert (research.budget_per_month, research.budget_currency, research.budget_warn_percent,
            research.spent_this_month) == (Decimal(1000), "EUR", 90, 0)  # fmt: skip


def test_a_team_budget_is_refused_without_change_team(client):
    research = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    as_user(client, grant(staff_user("viewer"), "fleet.view_team"))

    answer = patch(client, f"/api/v1/teams/{research.pk}/", {"budget_per_month": "1"})

    assert answer.status_code == 403
    research.refresh_from_db()
    assert research.budget_per_month is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"budget_per_month": "-5"}, "budget_per_month"),
        ({"budget_currency": "euro"}, "budget_currency"),
        ({"budget_warn_percent": 0}, "budget_warn_percent"),
        ({"budget_warn_percent": 101}, "budget_warn_percent"),
    ],
)
def test_a_bad_budget_is_refused_by_its_field(client, body, field):
    research = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    as_user(client, operator())

    answer = patch(client, f"/api/v1/teams/{research.pk}/", body)

    assert answer.status_code == 400 and field in answer.json(), answer.json()
    research.refresh_from_db()
    assert (research.budget_per_month, research.budget_currency,
            research.budget_warn_percent) == (None, "USD", 80)  # fmt: skip


# ---- costs -------------------------------------------------------------------------------


def test_the_day_by_team_and_model_with_the_idle_apart_and_the_totals(client):
    a_day()
    as_user(client, operator())

    answer = client.get("/api/v1/costs/", period())

    assert answer.status_code == 200
    got = answer.json()
    assert (got["start"], got["end"]) == ("2026-11-03T00:00:00Z", "2026-11-04T00:00:00Z")
    assert got["seen"] == "every team, the fleet's models and the idle"
    rows = {(r["team"], r["model"]): r for r in got["rows"]}
    assert list(rows) == [("research", "llama-70b"), ("vision", "vit-l")]  # most cost first
    llama, vit = rows[("research", "llama-70b")], rows[("vision", "vit-l")]
    assert (llama["gpu_hours"], llama["cost"], llama["tokens"]) == (96.0, "240.000000", 60_000_000)
    assert llama["cost_per_million_tokens"] == "4.000000"
    assert llama["utilisation"] == pytest.approx(60 / 72)
    assert (vit["gpu_hours"], vit["cost"], vit["cost_per_million_tokens"]) == (
        24.0, "60.000000", "2.500000")  # fmt: skip
    assert vit["utilisation"] == pytest.approx(1.0)
    [idle] = got["idle"]
    assert (idle["idle"], idle["gpu_class"], idle["gpu_hours"], idle["cost"]) == (
        True, "NVIDIA H100 80GB HBM3", 72.0, "180.000000")  # fmt: skip
    assert idle["utilisation"] is None and idle["cost_per_million_tokens"] is None
    [total] = got["totals"]
    assert (total["gpu_hours"], total["cost"], total["currency"]) == (192.0, "480.000000", "EUR")


def test_by_team_alone_sums_each_team_s_models(client):
    a_day()
    as_user(client, operator())

    got = client.get("/api/v1/costs/", {**period(), "by": "team"}).json()

    assert [(r["team"], r["model"], r["cost"]) for r in got["rows"]] == [
        ("research", None, "240.000000"), ("vision", None, "60.000000")]  # fmt: skip


def test_the_csv_export_has_a_header_one_line_a_row_then_the_idle_and_no_totals(client):
    a_day()
    as_user(client, operator())

    by_format = client.get("/api/v1/costs/", {**period(), "format": "csv"})
    by_accept = client.get("/api/v1/costs/", period(), HTTP_ACCEPT="text/csv")

    assert by_format["Content-Type"] == "text/csv; charset=utf-8"
    assert 'filename="llmgw-costs-2026-11-03_2026-11-04.csv"' in by_format["Content-Disposition"]
    assert by_accept.content == by_format.content
    lines = list(csv.reader(io.StringIO(by_format.content.decode())))
    assert lines[0] == ["start", "end", "team", "model", "gpu_class", "idle", "gpu_hours", "cost",
                        "currency", "tokens", "cost_per_million_tokens", "utilisation"]  # fmt: skip
    assert [line[2:6] for line in lines[1:]] == [
        ["research", "llama-70b", "", "false"],
        ["vision", "vit-l", "", "false"],
        ["", "", "NVIDIA H100 80GB HBM3", "true"],
    ]
    assert lines[1][0] == "2026-11-03T00:00:00Z"
    assert lines[1][6:10] == ["96.0", "240.000000", "EUR", "60000000"]
    # unknown is an empty cell, never 0
    assert lines[3][10:] == ["", ""]


def test_a_member_sees_their_team_s_costs_only_and_totals_of_those(client):
    teams = a_day()
    alice = grant(staff_user("alice"), "fleet.view_costhour")
    alice.groups.add(teams["research"].group)
    as_user(client, alice)

    got = client.get("/api/v1/costs/", period()).json()
    exported = client.get("/api/v1/costs/", {**period(), "format": "csv"}).content.decode()

    assert got["seen"] == "team 'research' only"
    assert [(r["team"], r["model"]) for r in got["rows"]] == [("research", "llama-70b")]
    assert got["idle"] == [] and got["unpriced"] == []
    assert [t["cost"] for t in got["totals"]] == ["240.000000"]
    assert "vision" not in exported and "vit-l" not in exported and "true" not in exported


def test_someone_in_no_team_sees_the_fleet_s_models_and_the_idle(client):
    a_day()
    as_user(client, grant(staff_user("nobody"), "fleet.view_costhour"))

    got = client.get("/api/v1/costs/", period()).json()

    assert got["rows"] == []
    assert [i["cost"] for i in got["idle"]] == ["180.000000"]
    assert [t["cost"] for t in got["totals"]] == ["180.000000"]


def test_costs_need_view_costhour(client):
    a_day()
    as_user(client, grant(staff_user("viewer"), "fleet.view_team"))

    assert client.get("/api/v1/costs/", period()).status_code == 403
    assert client.get("/api/v1/costs/", {**period(), "format": "csv"}).status_code == 403


@pytest.mark.parametrize(
    ("query", "field", "said"),
    [
        ({"start": "last tuesday"}, "start", "neither a date"),
        ({"end": "2026-13-01"}, "end", "neither a date"),
        ({"start": "2026-11-04", "end": "2026-11-03"}, "end", "is not after start"),
        ({"by": "team,colour"}, "by", "costs are reported by any of team, model, gpu_class"),
        ({"format": "xlsx"}, "format", "'xlsx' is not a format costs come in: json or csv"),
    ],
)
def test_a_bad_query_is_a_400_in_json_even_for_csv(client, query, field, said):
    as_user(client, operator())

    for extra in ({}, {"format": "csv"}):
        answer = client.get("/api/v1/costs/", {**extra, **query})
        assert answer.status_code == 400
        assert answer["Content-Type"] == "application/json"
        assert said in answer.json()[field][0]


def test_options_describes_the_route_in_json_even_when_csv_is_asked_for(client):
    as_user(client, operator())

    answer = client.options("/api/v1/costs/?format=csv")

    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    assert answer.json()["name"] == "Cost List"


def test_by_default_the_period_is_this_month_so_far(client):
    as_user(client, operator())

    got = client.get("/api/v1/costs/").json()

    now = timezone.now()
    assert got["start"] == now.strftime("%Y-%m-01T00:00:00Z")
    assert got["rows"] == [] and got["totals"] == []
