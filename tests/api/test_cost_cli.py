"""``llmgw costs`` against a live control plane over real HTTP: the day of
tests/costs/surfaces.py as a table with the idle and the totals, by team alone, as CSV,
and a bad date refused with the API's words."""

import csv
import io

import pytest

from agentd.ctl import exits
from fleet.models import CostHour, Model
from tests.api.test_cli import cli  # noqa: F401 - a fixture
from tests.costs.surfaces import DAY, a_day

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def test_costs_prints_the_day_by_team_and_model_with_the_idle_and_the_total(cli):  # noqa: F811
    a_day()

    status, out, err = cli("costs", "--from", "2026-11-03", "--to", "2026-11-03")

    assert status == 0, err
    assert err == (
        "costs from 2026-11-03 00:00 to 2026-11-04 00:00 UTC, of every team, the fleet's "
        "models and the idle\n"
    )
    header, *rows = out.splitlines()
    assert header.split() == ["TEAM", "MODEL", "GPU-HOURS", "COST", "TOKENS", "PER", "1M",
                              "TOKENS", "UTILISATION"]  # fmt: skip
    assert [r.split() for r in rows] == [
        ["research", "llama-70b", "96.0", "240.00", "EUR", "60,000,000", "4.00", "EUR", "83%"],
        ["vision", "vit-l", "24.0", "60.00", "EUR", "24,000,000", "2.50", "EUR", "100%"],
        ["idle", "(NVIDIA", "H100", "80GB", "HBM3)", "72.0", "180.00", "EUR", "-", "-", "-"],
        ["total", "192.0", "480.00", "EUR", "84,000,000", "5.71", "EUR", "-"],
    ]

    status, out, _ = cli("costs", "--from", "2026-11-03", "--to", "2026-11-03", "--by", "team")
    assert status == 0
    assert [r.split()[:3] for r in out.splitlines()[1:3]] == [
        ["research", "96.0", "240.00"], ["vision", "24.0", "60.00"]]  # fmt: skip


def test_costs_csv_is_the_api_s_export(cli):  # noqa: F811
    a_day()

    status, out, _ = cli("costs", "--from", "2026-11-03", "--to", "2026-11-03", "--csv")

    assert status == 0
    lines = list(csv.reader(io.StringIO(out)))
    assert lines[0][:4] == ["start", "end", "team", "model"]
    assert [line[2:4] for line in lines[1:]] == [["research", "llama-70b"],
                                                 ["vision", "vit-l"], ["", ""]]  # fmt: skip


def test_costs_with_a_bad_date_says_why_and_exits_refused(cli):  # noqa: F811
    status, out, err = cli("costs", "--from", "last tuesday")

    assert (status, out) == (exits.EXIT_REFUSED, "")
    assert "start: 'last tuesday' is neither a date (2026-01-31) nor an ISO 8601 time" in err


def test_hours_of_nodes_without_gpus_are_named_so_where_no_price_is_set(cli):  # noqa: F811
    # `make run`'s fleet: one node without GPUs, no price for it, a fleet model on it
    tiny = Model.objects.create(name="tiny-llama")
    CostHour.objects.bulk_create(
        CostHour(hour=DAY, model=model, model_name=model.name if model else "", idle=not model,
                 gpu_class="", gpu_seconds=1800, cost=0, currency="USD", closed=True)
        for model in (tiny, None)
    )  # fmt: skip

    status, out, err = cli("costs", "--from", "2026-11-03", "--to", "2026-11-03")
    _, by_class, _ = cli("costs", "--from", "2026-11-03", "--to", "2026-11-03", "--by",
                         "gpu_class")  # fmt: skip

    assert status == 0
    assert err.endswith("no price for: CPU-only nodes (costed at 0)\n"), err
    assert [r.split()[:3] for r in out.splitlines()[1:3]] == [
        ["(fleet)", "tiny-llama", "0.5"], ["idle", "(CPU-only", "nodes)"]]  # fmt: skip
    assert by_class.splitlines()[1].split()[:3] == ["CPU-only", "nodes", "0.5"]
