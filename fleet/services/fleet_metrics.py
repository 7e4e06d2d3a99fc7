"""The fleet gauges on /metrics: each node's CPU, load and memory, and each engine's share.

Agents send these with their heartbeats; nothing is scraped on the nodes. The
names are the Go system's, so dashboards and alerts carry over. A sample more
than a minute old is left out rather than repeated: a silent node must not
look busy (or idle) forever. A node that never reported its memory has no
``llmgw_node_memory_bytes`` line: unknown is not zero. Beside them, whether
each connected node keeps up with its desired set (``desired.not_keeping_up``),
and the fleet's GPUs by health with the XIDs they reported (``llmgw_gpu_health``,
``llmgw_gpu_xid_total``), and what each team's models cost so far
(``llmgw_cost_total``, from the accrual's cost hours: fleet.services.costs).
"""

import logging
from decimal import Decimal

from django.db import DatabaseError
from django.db.models import Count, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from . import desired
from .nodes import LOAD_MAX_AGE
from .units import over_gpu_budget

logger = logging.getLogger(__name__)

_registered = False


def _families():
    return {
        "cpu": GaugeMetricFamily(
            "llmgw_node_cpu_utilization_percent",
            "CPU busy across all of the node's cores, percent.",
            labels=["node"],
        ),
        "cpus": GaugeMetricFamily("llmgw_node_cpus", "CPUs on the node.", labels=["node"]),
        "load": GaugeMetricFamily(
            "llmgw_node_load", "Load average over the window.", labels=["node", "window"]
        ),
        "mem_total": GaugeMetricFamily(
            "llmgw_node_memory_bytes", "Memory the node has.", labels=["node"]
        ),
        "mem_used": GaugeMetricFamily(
            "llmgw_node_memory_used_bytes", "Memory in use on the node.", labels=["node"]
        ),
        "mem_available": GaugeMetricFamily(
            "llmgw_node_memory_available_bytes",
            "Memory available for new work on the node.",
            labels=["node"],
        ),
        "shard_cpu": GaugeMetricFamily(
            "llmgw_shard_cpu_cores",
            "CPU cores an engine's process group uses.",
            labels=["node", "shard", "model"],
        ),
        "shard_mem": GaugeMetricFamily(
            "llmgw_shard_memory_bytes",
            "Resident memory of an engine's process group.",
            labels=["node", "shard", "model"],
        ),
        "shard_gpu_mem": GaugeMetricFamily(
            "llmgw_shard_gpu_memory_bytes",
            "GPU memory an engine's process group holds on the GPU where it holds the most.",
            labels=["node", "shard", "model"],
        ),
        "shard_gpu_budget": GaugeMetricFamily(
            "llmgw_shard_gpu_memory_budget_bytes",
            "GPU memory a shard may use on each of its GPUs (a profile that shares GPUs).",
            labels=["node", "shard", "model"],
        ),
        "shard_over_budget": GaugeMetricFamily(
            "llmgw_shard_over_gpu_budget",
            "1 when a shard holds more GPU memory than its budget, else 0.",
            labels=["node", "shard", "model"],
        ),
        "lag": GaugeMetricFamily(
            "llmgw_node_desired_lag_seconds",
            "Seconds a connected node's acknowledged desired version has been behind "
            "the desired one without progress; 0 when caught up.",
            labels=["node"],
        ),
        # docs/operations.md, "GPU faults and notices".
        "gpu_health": GaugeMetricFamily(
            "llmgw_gpu_health",
            "GPUs in the fleet by health: healthy, degraded (nothing new placed on "
            "them) or failed (their replicas moved, held out until cleared).",
            labels=["state"],
        ),
        # A counter: the fleet's GPUs' XID counts, summed at each scrape from the
        # database. It goes down only when a GPU leaves the fleet (a reset, to Prometheus).
        "xids": CounterMetricFamily(
            "llmgw_gpu_xid",
            "XID errors the fleet's GPUs reported, by XID number (agentd/xid.py).",
            labels=["xid"],
        ),
        # A counter: every cost hour's cost, summed at each scrape. The open hour's grows
        # as the accrual counts it; a re-priced hour (a price set back-dated) may move it
        # either way, which Prometheus reads as a reset: rate() over it stays right.
        "cost": CounterMetricFamily(
            "llmgw_cost",
            "What the fleet's GPU-hours cost, at the prices of each hour, by team and "
            'model; model="" is the idle no replica held, team="" the fleet\'s models. '
            "Never summed across currencies.",
            labels=["team", "model", "currency"],
        ),
        # Teams' budgets in money (fleet.services.costs.budgets), as the accrual counted.
        "team_spent": GaugeMetricFamily(
            "llmgw_team_spent_this_month",
            "What a team's models cost so far this UTC month, in its budget's currency.",
            labels=["team", "currency"],
        ),
        "team_budget": GaugeMetricFamily(
            "llmgw_team_budget_per_month",
            "A team's budget for a UTC month; teams without one have no line.",
            labels=["team", "currency"],
        ),
        "team_warning": GaugeMetricFamily(
            "llmgw_team_budget_warning",
            "1 once a team has spent its warning share of this month's budget, else 0.",
            labels=["team"],
        ),
        "team_budget_spent": GaugeMetricFamily(
            "llmgw_team_budget_spent",
            "1 once a team has spent this month's budget (its keys are refused), else 0.",
            labels=["team"],
        ),
        "not_keeping_up": GaugeMetricFamily(
            "llmgw_node_not_keeping_up",
            "1 when a connected node has lagged its desired version for longer than "
            "LLMGW_DESIRED_LAG_BOUND_S, else 0.",
            labels=["node"],
        ),
    }


def collect_fleet(now=None) -> list:
    """The fleet gauges as metric families, in eight queries whatever the fleet's size."""
    from fleet.models import GPU, CostHour, GPUHealth, Node, NodeLoad, Shard, ShardLoad, Team

    from .costs.budgets import Budget, month_start

    now = now or timezone.now()
    since = now - LOAD_MAX_AGE
    f = _families()
    for node_id, total_mb in Node.objects.filter(memory_total_mb__isnull=False).values_list(
        "id", "memory_total_mb"
    ):
        f["mem_total"].add_metric([node_id], total_mb * 2**20)
    # Connected nodes only, as desired.not_keeping_up judges them: a
    # disconnected node cannot hear, and has silence timers of its own.
    for node_id, lag_since in Node.objects.filter(connected=True).values_list(
        "id", "desired_lag_since"
    ):
        f["lag"].add_metric([node_id], desired.lag_s(lag_since, now))
        f["not_keeping_up"].add_metric([node_id], int(desired.not_keeping_up(True, lag_since, now)))
    by_health = dict(GPU.objects.values_list("health").annotate(n=Count("id")))
    for state in GPUHealth.values:  # every state, 0 included: an alert needs the series
        f["gpu_health"].add_metric([state], by_health.get(state, 0))
    xids: dict[str, int] = {}
    for counts in GPU.objects.exclude(xids={}).values_list("xids", flat=True):
        for number, n in (counts or {}).items():
            xids[str(number)] = xids.get(str(number), 0) + int(n)
    for number, n in sorted(xids.items(), key=lambda kv: (len(kv[0]), kv[0])):
        f["xids"].add_metric([number], n)
    costs = (
        CostHour.objects.values_list("team_name", "model_name", "currency")
        .annotate(total=Sum("cost"))
        .order_by("team_name", "model_name", "currency")
    )
    for team, model, currency, total in costs:
        f["cost"].add_metric([team, model, currency], float(total or 0))
    month = month_start(now)
    for name, budget, currency, warn, spent, counted in Team.objects.values_list(
        "name",
        "budget_per_month",
        "budget_currency",
        "budget_warn_percent",
        "spent_this_month",
        "spent_updated_at",
    ):
        # Counted last month, nothing counted yet this one.
        b = Budget(
            name, budget, currency, warn, spent if counted and counted >= month else Decimal(0)
        )
        f["team_spent"].add_metric([name, currency], float(b.spent))
        if budget is not None:
            f["team_budget"].add_metric([name, currency], float(budget))
            f["team_warning"].add_metric([name], int(b.state in ("warned", "spent")))
            f["team_budget_spent"].add_metric([name], int(b.state == "spent"))
    for load in NodeLoad.objects.filter(sampled_at__gte=since):
        node = load.node_id
        f["cpu"].add_metric([node], load.cpu_percent)
        f["cpus"].add_metric([node], load.cpu_count)
        for window, value in (("1m", load.load1), ("5m", load.load5), ("15m", load.load15)):
            f["load"].add_metric([node, window], value)
        f["mem_used"].add_metric([node], load.memory_used_bytes)
        f["mem_available"].add_metric([node], load.memory_available_bytes)
    samples = list(ShardLoad.objects.filter(sampled_at__gte=since))
    # A process the agent measures may belong to no shard the control plane
    # knows (yet); it is still using the machine, so it is shown without a model.
    known = {
        shard_id: (model, budget)
        for shard_id, model, budget in Shard.objects.filter(
            id__in={s.shard_id for s in samples}
        ).values_list("id", "replica__model__name", "replica__profile__gpu_memory_gb")
    }
    for s in samples:
        model, budget = known.get(s.shard_id, ("", None))
        labels = [s.node_id, s.shard_id, model]
        f["shard_cpu"].add_metric(labels, s.cpu_cores)
        f["shard_mem"].add_metric(labels, s.rss_bytes)
        if s.gpu_memory_mb is not None:
            f["shard_gpu_mem"].add_metric(labels, s.gpu_memory_mb * 2**20)
        if budget:
            f["shard_gpu_budget"].add_metric(labels, round(budget * 2**30))
            over = over_gpu_budget(s.gpu_memory_mb, budget)
            f["shard_over_budget"].add_metric(labels, int(over))
    return list(f.values())


class FleetCollector:
    def describe(self):
        return list(_families().values())

    def collect(self):
        try:
            return collect_fleet()
        except DatabaseError:
            logger.warning("fleet metrics: the database did not answer")
            return []


def register() -> None:
    global _registered
    if _registered:
        return
    from fleet.metrics import REGISTRY

    REGISTRY.register(FleetCollector())
    _registered = True
