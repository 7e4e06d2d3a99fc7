"""The Grafana dashboard (docs/grafana/llmgw.json) and the suggested alert rules
(docs/prometheus/llmgw-alerts.yml) query only metrics llmgw really exposes on /metrics.

A renamed metric, or a query naming a counter without its ``_total`` or a histogram
without ``_bucket``, would leave a panel empty or an alert silent for ever; here it
fails. The registries are filled first as a running control plane fills them (a node
heard from with an engine, a reconciler pass, the gateway's counters, histograms and
in-flight gauges), so every family has samples, and the names checked are the samples'
names as Prometheus reads them.
"""

import asyncio
import json
import re

import pytest
import yaml
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleet import metrics
from fleet.gateway import metrics as gateway_metrics
from fleet.gateway import state as gateway_state
from fleet.gateway.state import Gateway
from fleet.gateway.table import Route, Upstream
from fleet.models import FleetStatus
from tests.factories import LLAMACPP_CPU, add_model, add_node, add_replica, report_load
from tests.processes import ROOT

pytestmark = pytest.mark.django_db

DASHBOARD = ROOT / "docs" / "grafana" / "llmgw.json"
ALERTS = ROOT / "docs" / "prometheus" / "llmgw-alerts.yml"
# Series Prometheus makes itself for each target, not found on any /metrics.
PROMETHEUS_SERIES = {"up"}
MODEL = "grafana-check"

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}
_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana's ``$variables`` allowed)."""
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables
    expr = _STRINGS.sub('""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges and subqueries
    expr = _GROUPING.sub("", expr)
    return {name for name in _IDENT.findall(expr) if name not in _KEYWORDS}


def test_metric_names_finds_the_selectors_and_nothing_else():
    expr = (
        'histogram_quantile(0.95, sum by (model, le) (rate(a_bucket{model=~"$model"}'
        "[$__rate_interval]))) / on (node) group_left max without (x) (b_total offset 5m)"
        ' + count(c{window="1m"}) > bool 1e3'
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}
    assert metric_names("label_values(llmgw_node_cpus, node)") == {"llmgw_node_cpus", "node"}


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and template variable of the dashboard."""
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r}", target["expr"]))
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        for text in {query, var.get("definition", query)}:
            # label_values(METRIC, LABEL): the metric is the query, the label is not one
            text = re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", text)
            found.append((f"variable ${var['name']}", text))
    return found


def alert_queries() -> list[tuple[str, str]]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [
        (f"alert {rule['alert']}", rule["expr"])
        for group in rules["groups"]
        for rule in group["rules"]
    ]


def exposed_names() -> set[str]:
    """Every sample name /metrics serves once a node, a pass and the gateway have reported."""
    add_node("gpu-01", memory_total_mb=2063500, as_reported=True)
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    shard = add_replica(model, model.active_profile, ["gpu-01"]).shards.get()
    shared = add_model("phi", engine="vllm", gpu_memory_gb=20)
    on_gpu = add_replica(shared, shared.active_profile, ["gpu-01"]).shards.get()
    report_load(
        "gpu-01",
        shards=[
            {"shard_id": shard.pk, "cpu_cores": 1.5, "rss_bytes": 2**33},
            {"shard_id": on_gpu.pk, "cpu_cores": 1, "rss_bytes": 2**30, "gpu_memory_mb": 9000},
        ],
    )
    FleetStatus.objects.update_or_create(
        pk=1, defaults={"last_pass_at": timezone.now(), "passes": 3, "last_pass_ms": 12}
    )
    route = gateway_metrics.RouteMetrics(MODEL)
    route.count(200)
    route.latency.observe(0.2)
    route.ttft.observe(0.05)
    route.retries.inc()
    gateway_metrics.upstream_error(MODEL, "r-1", "connect")
    gateway_metrics.COOLDOWNS.labels(MODEL, "r-1").inc()
    # A started gateway of this process routing the model to one replica, where the
    # registered collector reads it (state.live_gateways): the in-flight and queue gauges.
    gateway = Gateway()
    gateway.started = True
    upstream = Upstream("r-1", MODEL, "http://127.0.0.1:9", MODEL)
    gateway.routes = {MODEL: Route(model_id=1, name=MODEL, created=0, upstreams=[upstream])}
    loop = asyncio.new_event_loop()
    gateway_state._gateways[loop] = gateway
    try:
        text = metrics.render().decode()
    finally:
        del gateway_state._gateways[loop]
        loop.close()
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


def test_every_metric_the_dashboard_and_the_alerts_query_is_on_metrics():
    exposed = exposed_names() | PROMETHEUS_SERIES
    queries = dashboard_queries() + alert_queries()

    missing = [
        f"{where}: {name} in {expr!r}"
        for where, expr in queries
        for name in sorted(metric_names(expr) - exposed)
    ]

    assert missing == [], "\n".join(missing)
    named = set().union(*(metric_names(expr) for _, expr in queries))
    # and the queries do read the fleet, the nodes, the engines and the gateway
    for family in ("llmgw_reconciler_", "llmgw_node_", "llmgw_shard_", "llmgw_gateway_"):
        assert any(n.startswith(family) for n in named), family
    assert {
        "llmgw_gateway_request_duration_seconds_bucket",
        "llmgw_gateway_request_duration_seconds_sum",
        "llmgw_gateway_request_duration_seconds_count",
        "llmgw_gateway_requests_total",
    } <= named


def test_the_dashboard_has_fleet_node_model_and_gateway_panels_on_one_datasource():
    board = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    for section in ("Fleet", "Nodes", "Models", "Gateway"):
        assert any(r.startswith(section) for r in rows), (section, rows)
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert all(p["targets"] for p in panels)
    # Every query goes to the dashboard's datasource variable: importable anywhere.
    assert {json.dumps(p["datasource"]) for p in panels} == {
        json.dumps({"type": "prometheus", "uid": "${datasource}"})
    }
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
