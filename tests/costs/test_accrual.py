"""Counting GPU-hours into costs over time: whole GPUs, shares, moves, restarts, price
changes and hour boundaries, through ``accrue`` and ``report`` on a real database.

Each counts once a minute (or five), and asserts what a user of the cost page
would read: each team's GPU-hours and cost, and that the teams' costs plus idle
are what the fleet's GPU-hours cost at the prices, within rounding.
"""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import transaction

from fleet.models import CostHour, Event, EventKind, FleetStatus, ShardState, Team
from fleet.services import costs
from fleet.services.costs import prices as price_rules

from .helpers import (
    H100,
    at,
    finish,
    fleet_cost,
    model,
    node,
    place,
    price,
    served,
    team,
    tick,
)

pytestmark = pytest.mark.django_db

FIVE = timedelta(minutes=5)


def by(report, team_name, model_name):
    [row] = [r for r in report.rows if (r.team, r.model) == (team_name, model_name)]
    return row


def assert_adds_up(report, fleet_gpu_hours, fleet_cost_usd):
    """The teams' rows plus idle are the fleet's GPU-hours, priced."""
    rows = report.rows + report.idle
    assert sum(r.gpu_hours for r in rows) == pytest.approx(fleet_gpu_hours)
    assert sum(r.cost for r in rows) == pytest.approx(fleet_cost_usd, abs=Decimal("0.0001"))
    [total] = report.totals
    assert total.gpu_hours == pytest.approx(fleet_gpu_hours)
    assert total.cost == pytest.approx(fleet_cost_usd, abs=Decimal("0.0001"))


def test_whole_gpus_of_two_teams_over_a_price_change_and_an_hour_boundary():
    # given: one node of 8 H100s; research's llama on 2, vision's qwen on 1; the H100
    # price is 2.00 an hour, and 3.00 from 11:00
    node("n1")
    research, vision = team("research"), team("vision")
    place(model("llama", research, gpus=2), "n1", 0, 1)
    place(model("qwen", vision), "n1", 2)
    price("H100", "2.00", at(0))
    price("H100", "3.00", at(11))
    # when: counted every five minutes from 10:00 to 12:05
    tick(at(10), at(12, 5), FIVE)
    # then
    got = costs.report(at(10), at(12))
    assert by(got, "research", "llama").gpu_hours == pytest.approx(4.0)
    assert by(got, "research", "llama").cost == Decimal("10.000000")  # 2 × 2.00 + 2 × 3.00
    assert by(got, "vision", "qwen").gpu_hours == pytest.approx(2.0)
    assert by(got, "vision", "qwen").cost == Decimal("5.000000")
    [idle] = got.idle
    assert (idle.gpu_class, idle.gpu_hours, idle.cost) == (H100, pytest.approx(10.0), 25)
    assert_adds_up(got, 16.0, Decimal("40"))
    hours, cost = fleet_cost(at(10), at(12))
    assert (hours, cost) == (pytest.approx(16.0), pytest.approx(Decimal(40)))
    # both hours are over and closed; the one under way is not
    assert set(CostHour.objects.filter(closed=True).values_list("hour", flat=True)) == {
        at(10),
        at(11),
    }
    assert not CostHour.objects.filter(hour=at(12), closed=True).exists()


def test_shares_count_their_share_and_the_rest_of_the_gpu_is_idle():
    node("n1", gpus=1)
    research, vision = team("research"), team("vision")
    place(model("small", research, share_gb=40), "n1", 0)
    place(model("tiny", vision, share_gb=20), "n1", 0)
    price("H100", "4.00", at(0))
    tick(at(10), at(11, 1), FIVE)
    got = costs.report(at(10), at(11))
    small, tiny = by(got, "research", "small"), by(got, "vision", "tiny")
    assert small.gpu_hours == pytest.approx(40 * 1024 / 81559)
    assert tiny.gpu_hours == pytest.approx(20 * 1024 / 81559)
    assert got.idle[0].gpu_hours == pytest.approx(1 - 60 * 1024 / 81559)
    assert_adds_up(got, 1.0, Decimal("4"))


def test_a_replica_moved_mid_hour_is_charged_where_it_was_for_as_long():
    # given: llama on n1 until 10:30, then on n2 (its old shard stopped)
    node("n1", gpus=2)
    node("n2", gpus=2)
    llama = model("llama", team("research"))
    first = place(llama, "n1", 0)

    def move(t):
        if t == at(10, 30):
            finish(first)
            place(llama, "n2", 1)

    price("H100", "2.00", at(0))
    tick(at(10), at(11, 1), timedelta(minutes=1), move)
    got = costs.report(at(10), at(11))
    assert by(got, "research", "llama").gpu_hours == pytest.approx(1.0)
    assert_adds_up(got, 4.0, Decimal("8"))


def test_a_restart_holds_nothing_between_the_failure_and_the_new_shard():
    node("n1", gpus=1)
    llama = model("llama", team("research"))
    shards = [place(llama, "n1", 0)]

    def fail_then_restart(t):
        if t == at(10, 20):
            finish(shards[0], ShardState.FAILED)
        if t == at(10, 40):
            shards.append(place(llama, "n1", 0))

    price("H100", "3.00", at(0))
    tick(at(10), at(11, 1), timedelta(minutes=1), fail_then_restart)
    got = costs.report(at(10), at(11))
    assert by(got, "research", "llama").gpu_hours == pytest.approx(40 / 60)
    assert got.idle[0].gpu_hours == pytest.approx(20 / 60)
    assert_adds_up(got, 1.0, Decimal("3"))


def test_cpu_only_nodes_count_node_hours_at_the_empty_class_s_price():
    node("cpu1", gpus=0, memory_gb=64)
    place(model("llama-cpu", team("research"), gpus=0, host_gb=16), "cpu1")
    price("", "0.80", at(0))
    tick(at(10), at(11, 1), FIVE)
    got = costs.report(at(10), at(11))
    llama = by(got, "research", "llama-cpu")
    assert (llama.gpu_hours, llama.cost) == (pytest.approx(0.25), Decimal("0.200000"))
    assert (got.idle[0].gpu_class, got.idle[0].gpu_hours) == ("", pytest.approx(0.75))
    assert_adds_up(got, 1.0, Decimal("0.8"))


def test_a_price_dated_back_prices_closed_hours_again():
    node("n1", gpus=1)
    place(model("llama", team("research")), "n1", 0)
    tick(at(10), at(12, 1), FIVE)
    before = costs.report(at(10), at(12))
    assert before.unpriced == [H100]
    assert by(before, "research", "llama").cost == 0
    # when: a price from 11:00 is set afterwards
    price("H100", "2.50", at(11))
    got = costs.report(at(10), at(12))
    assert by(got, "research", "llama").cost == Decimal("2.500000")
    assert got.unpriced == [H100]  # still, from 10:00 to 11:00
    assert costs.report(at(11), at(12)).unpriced == []


def test_the_longest_price_class_a_gpu_contains_prices_it():
    prices = [
        price_rules.PriceFact("H100", Decimal(2), "USD", at(0)),
        price_rules.PriceFact("H100 80GB", Decimal(3), "USD", at(12)),
        price_rules.PriceFact("", Decimal("0.5"), "USD", at(0)),
    ]
    assert price_rules.pick(H100, prices, at(11)).per_hour == 2  # the longer one not yet
    assert price_rules.pick(H100, prices, at(12)).per_hour == 3
    assert price_rules.pick("NVIDIA L4", prices, at(12)) is None
    assert price_rules.pick("", prices, at(12)).per_hour == Decimal("0.5")


def test_a_price_set_mid_hour_prices_the_hour_under_way_whole():
    node("n1", gpus=1)
    place(model("llama", team("research")), "n1", 0)
    tick(at(10), at(10, 30), FIVE)
    price("H100", "6.00", at(10, 30))  # set now, at 10:30
    tick(at(10, 35), at(11, 1), FIVE)
    got = costs.report(at(10), at(11))
    assert by(got, "research", "llama").cost == Decimal("6.000000")
    assert got.unpriced == []


def test_tokens_give_cost_per_million_and_utilisation_against_the_best_hour():
    node("n1", gpus=2)
    llama = model("llama", team("research"))
    place(llama, "n1", 0)
    price("H100", "2.00", at(0))
    served("llama", at(10), 4_000_000)
    served("llama", at(11), 1_000_000)
    tick(at(10), at(12, 1), FIVE)
    got = costs.report(at(10), at(12))
    row = by(got, "research", "llama")
    assert row.tokens == 5_000_000
    assert row.cost_per_million_tokens == Decimal("0.800000")  # 4.00 for 5M tokens
    # its best hour served 4M tokens on one GPU-hour: two hours could have served 8M
    assert got.peaks["llama"] == pytest.approx(4_000_000)
    assert row.utilisation == pytest.approx(5 / 8)
    assert got.idle[0].utilisation is None


def test_a_long_stop_is_not_counted_past_the_gap_bound():
    node("n1", gpus=1)
    place(model("llama", team("research")), "n1", 0)
    costs.accrue(at(10))
    done = costs.accrue(at(10, 30))  # the control plane was stopped for 30 minutes
    assert done.seconds == 300 and done.left_out_s == 1500
    assert FleetStatus.get().cost_accrued_at == at(10, 30)


def test_a_count_behind_the_last_one_changes_nothing():
    node("n1", gpus=1)
    place(model("llama", team("research")), "n1", 0)
    costs.accrue(at(10))
    costs.accrue(at(10, 5))
    assert costs.accrue(at(10, 4)).skipped  # a worker whose clock is a minute behind
    assert FleetStatus.get().cost_accrued_at == at(10, 5)
    costs.accrue(at(10, 6))
    assert CostHour.objects.get(idle=False).gpu_seconds == pytest.approx(360)


def test_a_team_past_its_warning_and_then_its_budget_gets_one_event_each():
    node("n1", gpus=8)
    research = team("research", budget_per_month=Decimal("10"), budget_warn_percent=50)
    place(model("llama", research, gpus=4), "n1", 0, 1, 2, 3)
    price("H100", "1.00", at(0))
    # 4 GPUs at 1.00: 5.00 (the warning) after 75 minutes, 10.00 after 150
    tick(at(10), at(11, 20), FIVE)
    research.refresh_from_db()
    assert research.spent_this_month == pytest.approx(Decimal("5.333333"), abs=Decimal("0.01"))
    assert research.budget_warned_at is not None and research.budget_spent_at is None
    tick(at(11, 25), at(12, 40), FIVE)
    research.refresh_from_db()
    assert research.budget_spent_at is not None
    reasons = list(Event.objects.filter(kind=EventKind.BUDGET).values_list("reason", flat=True))
    assert len(reasons) == 2
    assert "past its warning at 50%" in reasons[1]
    assert "team 'research' has spent its budget of 10.00 USD" in reasons[0]
    # when: the budget is raised, the team is no longer spent
    Team.objects.filter(pk=research.pk).update(budget_per_month=Decimal("100"))
    costs.accrue(at(12, 45))
    research.refresh_from_db()
    assert research.budget_spent_at is None and research.budget_warned_at is None


def test_the_report_reads_a_flat_number_of_queries_whatever_the_fleet(
    django_assert_max_num_queries,
):
    for i in range(6):
        node(f"n{i}")
        place(model(f"m{i}", team(f"t{i}")), f"n{i}", 0)
    tick(at(10), at(11, 1), FIVE)
    with django_assert_max_num_queries(3):
        got = costs.report(at(10), at(11))
    assert len(got.rows) == 6


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_the_hours_add_up_and_a_spent_budget_is_seen(postgres):
    """The second database path: the upsert, the SQL that prices rows, the closing and the
    report's aggregates as PostgreSQL runs them."""
    # given, when, then: as on SQLite
    test_whole_gpus_of_two_teams_over_a_price_change_and_an_hour_boundary()
    # when: research's budget is below the 10.00 it has spent
    Team.objects.filter(name="research").update(budget_per_month=Decimal("8"))
    costs.accrue(at(12, 6))
    research = Team.objects.get(name="research")
    assert research.spent_this_month >= Decimal("10")
    assert research.budget_spent_at is not None
    assert Event.objects.filter(kind=EventKind.BUDGET, reason__contains="research").count() == 2
    with transaction.atomic():
        assert len(costs.report(at(10), at(12)).rows) == 2
