"""The operator's console in a real Chromium over the live stack (issue 12): the cluster page
an operator lands on, a node's page with its charts, logs and actions, and a model's page.

The module's ``live_fleet`` is a stack of its own: Daphne, a Celery worker and beat, the
agent ``live_fleet.node_id`` with the tiny model ``live_fleet.model`` ready on it and
answering through the gateway. Its history keeps a point a second, so the node page's
charts have points within seconds rather than the default 15 s steps.

Every visit fails on a console error or a failed request (a 404 on a static file
included), and so does the end of every test, whatever a click or an in-place refresh
loaded. Waits poll with a deadline; nothing asserts a time. ``LLMGW_SCREENSHOTS=1``
writes the README's pictures (docs/img/cluster.png and node.png).
"""

from __future__ import annotations

import re

import pytest

from fleet.models import Model, Node
from tests.processes import Load


def _bar(row, kind: str) -> dict:
    bar = row.find_element("css selector", f".bar.{kind}")
    return {
        "percent": bar.get_attribute("data-percent"),
        "label": bar.find_element("css selector", ".label").get_attribute("textContent").strip(),
    }


def _mark_page(browser) -> None:
    """A mark a reload would lose: finding it later proves the page refreshed in place."""
    browser.driver.execute_script("window.__consoleMark = 'kept';")


def _page_kept(browser) -> bool:
    return browser.driver.execute_script("return window.__consoleMark") == "kept"


def test_logging_in_from_the_front_door_lands_on_the_cluster_page(browser, live_fleet):
    # given: a browser with no session, opening the site's root
    browser.use(live_fleet.url)
    browser.forget_cookies()
    browser.visit("/")
    assert browser.path == "/admin/login/", "an anonymous operator is asked to log in"

    # when: the operator logs in through the form
    browser.log_in(live_fleet.username, live_fleet.password, next_path="/admin/cluster/")

    # then: the first page is the cluster page, styled, reachable again from every header
    assert browser.find_all("#cluster-nodes"), browser.text()[:500]
    browser.assert_styled()
    assert browser.find("#nav-cluster").get_attribute("href").endswith("/admin/cluster/")


def test_the_cluster_page_lists_the_node_with_its_bars(signed_in, live_fleet):
    signed_in.visit("/admin/cluster/")
    signed_in.assert_styled()

    row = signed_in.find(f'tr.node-row[data-node-id="{live_fleet.node_id}"]')
    assert row.find_element("css selector", ".node-state").text == "ready"
    assert row.find_element("css selector", ".node-connected").text == "yes"
    cpu, ram = _bar(row, "cpu"), _bar(row, "ram")
    # The agent reports both: a width and a text, never the "-" of an unknown figure.
    assert cpu["percent"] and 0 <= float(cpu["percent"]) <= 100, cpu
    assert ram["percent"] and 0 < float(ram["percent"]) <= 100, ram
    assert re.fullmatch(r"[\d.]+ [KMGT]iB / [\d.]+ [KMGT]iB", ram["label"]), ram
    width = signed_in.driver.execute_script(
        "return arguments[0].querySelector('.fill').getBoundingClientRect().width",
        row.find_element("css selector", ".bar.ram"),
    )
    assert width > 0, "the RAM bar is drawn, not only labelled"
    engines = [e.text for e in row.find_elements("css selector", ".engines .engine")]
    assert any(e.startswith("llamacpp") for e in engines), engines
    assert row.find_element("css selector", ".node-shards").text == "1/1"

    # The model is listed ready, and nothing waits for a place.
    model = signed_in.find(f'tr.model-row[data-model="{live_fleet.model}"]')
    assert model.find_element("css selector", ".model-ready").text == "1 / 1"
    assert signed_in.find_all("#cluster-pending tr.pending-row") == []
    signed_in.screenshot("cluster")


def test_the_cluster_page_refreshes_in_place_as_the_load_changes(signed_in, live_fleet):
    signed_in.visit("/admin/cluster/")
    row_css = f'tr.node-row[data-node-id="{live_fleet.node_id}"]'
    before = _bar(signed_in.find(row_css), "cpu")
    _mark_page(signed_in)

    # when: requests keep the node's CPU busy for a while
    with Load(live_fleet.url, live_fleet.stack.inference_key, live_fleet.model, clients=2):
        # then: the CPU figure changes on the page without the page being loaded again
        changed = signed_in.wait(
            lambda d: (now := _bar(signed_in.find(row_css), "cpu")) != before and now,
            f"the CPU bar to move from {before}",
            timeout=60,
        )
    assert _page_kept(signed_in), "the page was reloaded, not refreshed in place"
    assert signed_in.find("#cluster-body").get_attribute("data-refreshed-at")
    assert changed["percent"], changed


def test_the_node_page_shows_its_figures_shards_and_an_hour_of_charts(signed_in, live_fleet):
    signed_in.visit("/admin/cluster/")
    signed_in.find(f'tr.node-row[data-node-id="{live_fleet.node_id}"] .node-id a').click()
    signed_in.wait_loaded()
    signed_in.check_page()
    assert signed_in.path == f"/admin/cluster/nodes/{live_fleet.node_id}/"
    signed_in.assert_styled()

    assert signed_in.text("#node-state") == "ready"
    load = signed_in.text("#node-load")
    assert load.count("/") == 2 and load != "-", load
    assert signed_in.find_all("#node-disks tr.disk-row"), "the agent's state dir is a disk"
    shard = signed_in.find("#node-shards tr.shard-row")
    assert shard.find_element("css selector", ".shard-state").text == "ready"
    assert shard.find_element("css selector", ".shard-cores").text not in ("", "-")
    memory = shard.find_element("css selector", ".shard-memory").text
    assert re.fullmatch(r"[\d.]+ [KMGT]iB", memory), memory

    # The charts load on their own, from the history the control plane keeps.
    signed_in.wait(
        lambda d: signed_in.find_all("#node-charts .charts"), "the charts to load", timeout=60
    )
    assert signed_in.find("#node-charts .charts").get_attribute("data-source") == "history"

    def points(chart: str) -> int:
        return int(signed_in.find(f"#chart-{chart}").get_attribute("data-points") or 0)

    # A point a second: reload the charts until the CPU chart has a line of a few points.
    def charted(d):
        if points("cpu") >= 3:
            return True
        d.execute_script(
            "const el = document.getElementById('node-charts');"
            "fetch(el.dataset.refreshUrl, {credentials: 'same-origin'})"
            ".then(r => r.text()).then(html => { el.innerHTML = html; });"
        )
        return False

    signed_in.wait(charted, "the CPU chart to hold 3 points", timeout=60)
    for chart in ("cpu", "memory", "load", "model-cores", "model-memory"):
        assert points(chart) >= 1, f"the {chart} chart has no point"
        drawn = signed_in.find_all(f"#chart-{chart} svg .series")
        assert drawn, f"the {chart} chart draws no line"
    assert signed_in.find_all("#chart-queue"), "the gateway's queue depth is charted"
    signed_in.screenshot("node", whole_page=True)


@pytest.mark.parametrize("source", ["agent", "engine"])
def test_the_logs_panel_shows_the_node_s_logs_on_demand(signed_in, live_fleet, source):
    signed_in.visit(f"/admin/cluster/nodes/{live_fleet.node_id}/")
    options = {o.get_attribute("value"): o for o in signed_in.find_all("#node-logs-source option")}
    value = "agent" if source == "agent" else next(v for v in options if v != "agent")
    options[value].click()
    signed_in.find("#node-logs-fetch").click()

    signed_in.wait(
        lambda d: signed_in.find_all("#node-logs-output .logs"), "the node's answer", timeout=30
    )
    answer = signed_in.find("#node-logs-output .logs")
    assert answer.get_attribute("data-kind") == "ok", answer.text
    lines = signed_in.text("#node-logs-lines")
    if source == "agent":
        assert "registered" in lines or "connected" in lines, lines[-2000:]
    else:
        # llama.cpp's server names itself in its log as it loads the model.
        assert "llama" in lines.lower(), lines[-2000:]


def test_cordon_and_uncordon_from_the_node_page_ask_first_then_act(signed_in, live_fleet):
    node_id = live_fleet.node_id
    signed_in.visit(f"/admin/cluster/nodes/{node_id}/")

    # when: the operator presses Cordon
    signed_in.find("#action-cordon").click()
    signed_in.wait_loaded()
    signed_in.check_page()

    # then: they are asked, and nothing is done until they say yes
    assert signed_in.find("#node-confirm").get_attribute("data-action") == "cordon"
    assert not Node.objects.get(pk=node_id).cordoned
    signed_in.find("#confirm-cordon").click()
    signed_in.wait(lambda d: signed_in.path.endswith(f"/nodes/{node_id}/"), "the node page")
    signed_in.wait_loaded()
    signed_in.check_page()
    assert Node.objects.get(pk=node_id).cordoned
    assert signed_in.text("#node-state") == "ready,cordoned"
    assert "cordon" in signed_in.text(".messagelist").lower()

    # and back: uncordon, confirmed, and the node takes work again
    signed_in.find("#action-uncordon").click()
    signed_in.wait_loaded()
    signed_in.find("#confirm-uncordon").click()
    signed_in.wait(lambda d: signed_in.path.endswith(f"/nodes/{node_id}/"), "the node page")
    signed_in.wait_loaded()
    signed_in.check_page()
    assert not Node.objects.get(pk=node_id).cordoned
    assert signed_in.text("#node-state") == "ready"


def test_the_model_page_shows_the_replica_where_it_runs_and_the_gateway_figures(
    signed_in, live_fleet
):
    model = Model.objects.get(name=live_fleet.model)
    with Load(live_fleet.url, live_fleet.stack.inference_key, live_fleet.model, clients=1):
        signed_in.visit("/admin/cluster/")
        signed_in.find(f'tr.model-row[data-model="{live_fleet.model}"] a').click()
        signed_in.wait_loaded()
        signed_in.check_page()
        assert signed_in.path == f"/admin/cluster/models/{model.pk}/"

        replica = signed_in.find("#model-replicas tr.replica-row")
        assert replica.find_element("css selector", ".replica-state").text == "ready"
        assert live_fleet.node_id in replica.text
        # The gateway's own figures, kept in Redis: a rate once requests have gone through.
        signed_in.wait(
            lambda d: signed_in.text("#model-rps") not in ("-", "0.00"),
            "requests/s through the gateway",
            timeout=60,
        )
    assert float(signed_in.text("#model-rps")) > 0
    assert signed_in.text("#model-latency").endswith(" s")
