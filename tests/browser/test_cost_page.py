"""The cost page in a real Chromium against a web process: the day of
tests/costs/surfaces.py, reached from the admin's navigation, shows each team's and
model's cost, tokens, cost per million tokens and utilisation, its chart stacked per
team with the idle on top and apart, and the period chooser; a member of one team sees
that team's costs only. No console error, no failed request, styled."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from fleet.models import FleetStatus
from tests.costs.surfaces import a_day
from tests.processes import start_web

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "a-password-for-browser-tests"


@pytest.fixture
def web(tmp_path, browser):
    server = start_web(tmp_path)
    yield server.url
    browser.leave()  # no page of it open as it stops (its problems were checked already)
    server.stop()


@pytest.fixture
def the_day():
    teams = a_day()
    # A fleet whose reconciler runs, as the operator's would: no banner saying it never ran.
    FleetStatus.objects.update_or_create(pk=1, defaults={"last_pass_at": timezone.now()})
    User = get_user_model()
    User.objects.create_superuser("payer", password=PASSWORD)
    alice = User.objects.create_user("alice", password=PASSWORD, is_staff=True)
    alice.user_permissions.add(Permission.objects.get(codename="view_costhour"))
    alice.groups.add(teams["vision"].group)
    return teams


def cell(row, cls: str) -> str:
    return row.find_element("css selector", f"td.{cls}").text


def test_an_operator_reads_the_day_s_costs_from_the_navigation(browser, web, the_day):
    browser.use(web)
    browser.forget_cookies()
    browser.log_in("payer", PASSWORD)

    # when: they follow the header's Costs link and choose the day
    browser.find("#nav-costs").click()
    browser.wait_loaded()
    browser.check_page()
    assert browser.path == "/admin/cluster/costs/"
    browser.driver.execute_script(
        "document.getElementById('costs-from').value = '2026-11-03';"
        "document.getElementById('costs-to').value = '2026-11-03';"
    )
    browser.find("#costs-dates [type=submit]").click()
    browser.wait(lambda d: "from=2026-11-03" in d.current_url, "the chosen day's page")
    browser.wait_loaded()
    browser.check_page()
    assert browser.find("#costs").get_attribute("data-period") == "custom"
    browser.assert_styled()
    assert not browser.find_all("[data-fleet-warning]")

    # then: each team's cost, tokens, cost per million tokens and utilisation
    rows = {r.get_attribute("data-team"): r for r in browser.find_all("#costs-teams tr.team-row")}
    assert list(rows) == ["research", "vision"]
    research, vision = rows["research"], rows["vision"]
    assert [cell(research, c) for c in ("gpu-hours", "cost", "tokens", "per-million",
                                        "utilisation")] == [
        "96.0", "240.00 EUR", "60,000,000", "4.00 EUR", "83%"]  # fmt: skip
    assert [cell(vision, c) for c in ("cost", "per-million", "utilisation")] == [
        "60.00 EUR", "2.50 EUR", "100%"]  # fmt: skip
    models = [(r.get_attribute("data-team"), r.get_attribute("data-model"))
              for r in browser.find_all("#costs-models tr.model-row")]  # fmt: skip
    assert models == [("research", "llama-70b"), ("vision", "vit-l")]
    # the idle apart, and in the totals
    [idle] = browser.find_all("#costs-idle tr.idle-row")
    assert (cell(idle, "gpu-hours"), cell(idle, "cost")) == ("72.0", "180.00 EUR")
    assert browser.text("#costs-totals [data-total=cost]") == "480.00 EUR"
    assert browser.text("#costs-totals [data-total=idle-share]") == "38% idle"
    # the chart: one bar for the day, research at the bottom, the idle on top, apart
    chart = browser.find("#chart-cost-EUR")
    segments = chart.find_elements("css selector", "rect.segment")
    drawn = [(s.get_attribute("data-series"), s.get_attribute("data-cost")) for s in segments]
    assert drawn == [("research", "240.00"), ("vision", "60.00"), ("idle", "180.00")]
    ys = [float(s.get_attribute("y")) for s in segments]
    assert ys == sorted(ys, reverse=True)
    assert segments[-1].get_attribute("class") == "segment idle"
    assert segments[0].rect["height"] > segments[1].rect["height"] > 0
    legend = chart.find_element("css selector", ".legend").text
    assert "idle (no replica) 180.00 EUR" in legend
    browser.screenshot("console-costs", whole_page=True)

    # and the named periods are offered
    browser.find("#costs-period-choice option[value='7d']").click()
    browser.find("#costs-period [type=submit]").click()
    browser.wait(lambda d: "period=7d" in d.current_url, "the last 7 days' page")
    browser.wait_loaded()
    browser.check_page()
    assert browser.find("#costs").get_attribute("data-period") == "7d"
    assert browser.text("#costs-about").startswith("The last 7 days: ")


def test_a_member_of_one_team_sees_that_team_s_costs_only(browser, web, the_day):
    browser.use(web)
    browser.forget_cookies()
    browser.log_in("alice", PASSWORD)

    browser.visit("/admin/cluster/costs/?from=2026-11-03&to=2026-11-03")

    assert browser.text("#costs-seen") == "You see team 'vision' only."
    teams = [r.get_attribute("data-team") for r in browser.find_all("#costs-teams tr.team-row")]
    assert teams == ["vision"]
    assert not browser.find_all("#costs-idle")
    assert browser.text("#costs-totals [data-total=cost]") == "60.00 EUR"
    page = browser.text("#costs")
    assert "research" not in page and "llama-70b" not in page and "480.00" not in page
