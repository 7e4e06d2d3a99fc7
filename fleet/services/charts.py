"""An hour of a node's charts: from Prometheus when one is configured, else from the history.

Both sources give the same charts (CPU, memory, load, per-model cores and
memory, the gateway's queue depth for the models on the node), so the page
draws them the same way and says where they came from. A source that fails
gives empty charts and an error in words, never a broken page.
"""

import time
from dataclasses import dataclass, field

import redis

from fleet.conf import fleet_settings
from fleet.models import Shard

from . import history, prometheus

WINDOW_S = 3600
# Models whose queue depth one node page asks for, at most.
MAX_QUEUE_MODELS = 10


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]


@dataclass
class Chart:
    key: str  # stable: the page's element ids and the tests use it
    title: str
    unit: str  # "percent", "bytes", "cores" or "count"
    series: list[Series] = field(default_factory=list)

    @property
    def points(self) -> int:
        return sum(len(s.points) for s in self.series)


@dataclass
class NodeCharts:
    charts: list[Chart]
    source: str  # "prometheus" or "history"
    start: float
    end: float
    error: str = ""


def _empty() -> list[Chart]:
    return [
        Chart("cpu", "CPU busy", "percent"),
        Chart("memory", "Memory", "bytes"),
        Chart("load", "Load average", "count"),
        Chart("model-cores", "CPU cores per model", "cores"),
        Chart("model-memory", "Memory per model", "bytes"),
        Chart("queue", "Gateway queue depth per model", "count"),
    ]


def node_charts(node_id: str, models: list[str], now: float | None = None) -> NodeCharts:
    """The node's last hour. ``models``: the models with shards on it (for queue depth)."""
    end = time.time() if now is None else now
    start = end - WINDOW_S
    models = sorted(set(models))[:MAX_QUEUE_MODELS]
    charts = _empty()
    if fleet_settings().prometheus_url:
        out = NodeCharts(charts, "prometheus", start, end)
        try:
            _from_prometheus(charts, node_id, models, start, end)
        except prometheus.PrometheusError as exc:
            out.error = str(exc)
        return out
    out = NodeCharts(charts, "history", start, end)
    try:
        _from_history(charts, node_id, models, start)
    except redis.RedisError as exc:
        out.error = f"the history in Redis could not be read: {exc}"
    return out


def _from_history(charts: list[Chart], node_id: str, models: list[str], start: float) -> None:
    cpu, memory, load, cores, rss, queue = charts
    points = history.node_points(node_id, start)
    shard_ids = {s[0] for p in points for s in p.get("s", ())}
    model_of = dict(
        Shard.objects.filter(id__in=shard_ids).values_list("id", "replica__model__name")
    )
    cpu.series.append(Series("CPU %", [(p["t"], p["c"]) for p in points]))
    memory.series.append(Series("used", [(p["t"], p["u"]) for p in points]))
    memory.series.append(Series("available", [(p["t"], p["a"]) for p in points]))
    for i, window in enumerate(("1m", "5m", "15m")):
        load.series.append(Series(window, [(p["t"], p["l"][i]) for p in points]))
    per_cores: dict[str, list] = {}
    per_rss: dict[str, list] = {}
    for p in points:
        sums_c: dict[str, float] = {}
        sums_m: dict[str, float] = {}
        for shard_id, c, m in p.get("s", ()):
            name = model_of.get(shard_id) or f"shard {shard_id}"
            sums_c[name] = sums_c.get(name, 0.0) + c
            sums_m[name] = sums_m.get(name, 0.0) + m
        for name, v in sums_c.items():
            per_cores.setdefault(name, []).append((p["t"], v))
        for name, v in sums_m.items():
            per_rss.setdefault(name, []).append((p["t"], v))
    cores.series.extend(Series(n, pts) for n, pts in sorted(per_cores.items()))
    rss.series.extend(Series(n, pts) for n, pts in sorted(per_rss.items()))
    for model in models:
        queue.series.append(Series(model, history.queue_points(model, start)))


def _from_prometheus(
    charts: list[Chart], node_id: str, models: list[str], start: float, end: float
) -> None:
    cpu, memory, load, cores, rss, queue = charts
    step = max(15.0, fleet_settings().history_step_s)
    node = prometheus.quote(node_id)

    def series(query: str, label_key: str | None, fixed: str = "") -> list[Series]:
        out = []
        for labels, pts in prometheus.query_range(query, start, end, step):
            out.append(Series(labels.get(label_key, "") if label_key else fixed, pts))
        return sorted(out, key=lambda s: s.label)

    cpu.series += series(f"llmgw_node_cpu_utilization_percent{{node={node}}}", None, "CPU %")
    memory.series += series(f"llmgw_node_memory_used_bytes{{node={node}}}", None, "used")
    memory.series += series(f"llmgw_node_memory_available_bytes{{node={node}}}", None, "available")
    load.series += series(f"llmgw_node_load{{node={node}}}", "window")
    cores.series += series(f"sum by (model) (llmgw_shard_cpu_cores{{node={node}}})", "model")
    rss.series += series(f"sum by (model) (llmgw_shard_memory_bytes{{node={node}}})", "model")
    for model in models:
        found = series(
            f"sum(llmgw_gateway_queue_depth{{model={prometheus.quote(model)}}})", None, model
        )
        queue.series += found or [Series(model, [])]
