"""One model's page: its replicas, where they run, why any wait, its scaling, and the
gateway's figures."""

from dataclasses import dataclass
from datetime import datetime

import redis
from django.db.models import Prefetch, Sum
from django.utils import timezone

from fleet.conf import fleet_settings
from fleet.models import Adapter, Event, KeyUsage, Model, Replica, ReplicaState, Shard

from .. import canary_figures, history, prometheus
from ..adapters import held
from ..autoscaler.status import last_decision, scaling_status, sleep_policy
from .lines import asleep_host_text


@dataclass
class ReplicaLine:
    id: str
    state: str
    reason: str
    restarts: int
    profile: str
    shards: list  # Shard rows with node
    evict: str = ""  # an operator's drain, stop or restart, and who asked
    evict_by: str = ""
    asleep: str = ""  # "asleep 4 minutes · holds 16 GB of host memory" (lines.asleep_host_text)


@dataclass
class GatewayFigures:
    source: str  # "prometheus", "history" or "" (none)
    requests_per_s: float | None = None
    latency_s: float | None = None
    p95_latency_s: float | None = None
    queue: float | None = None
    tokens_per_s: float | None = None  # completion tokens
    tokens: float | None = None  # completion tokens over the window
    error: str = ""


@dataclass
class AdapterLine:
    name: str
    source: str
    where: list  # (replica, node, state, error) per serving shard that reports it
    requests: int = 0  # through the gateways, all told (usage rows)
    tokens: int = 0  # prompt + completion


@dataclass
class ModelDetail:
    model: Model
    replicas: list[ReplicaLine]
    by_state: dict[str, int]
    gateway: GatewayFigures
    # As the admin, the API and `llmgw models` say it (autoscaler.status): "scaled to
    # zero", "starting for 3 waiting requests", "autoscaled 1-4: 2 wanted", or "".
    scaling: str = ""
    last_decision: Event | None = None  # the autoscaler's, with its reason
    # Its sleep policy (autoscaler.status.sleep_policy): "after 300 s idle, level 1"; "".
    sleep: str = ""
    # A canary's figures beside the active profile's since it began, from every gateway
    # (canary_figures): [(profile, answers, error rate, p95 time to first token)].
    canary: list[tuple[str, int, float, float | None]] | None = None
    canary_error: str = ""
    adapters: list[AdapterLine] | None = None


def canary_figures_of(model: Model) -> dict:
    """The canary's and the active profile's figures side by side, as the reconciler
    judges them; {} without a canary."""
    if model.canary_profile_id is None:
        return {}
    names = [
        model.active_profile.name if model.active_profile_id else "",
        model.canary_profile.name,
    ]
    try:
        figures = canary_figures.read(model.name, model.canary_profile_id)
    except redis.RedisError as exc:
        return {"canary": [], "canary_error": f"the gateways' figures cannot be read: {exc}"}
    rows = []
    for name in names:
        t = figures.get(name) or canary_figures.Tally()
        rows.append((name, t.requests, t.error_rate, t.p95_ttft()))
    return {"canary": rows}


# The window the model page's rates are taken over.
RATE_WINDOW_S = 300


def gateway_figures(name: str, now: float) -> GatewayFigures:
    """Requests a second and latency through the gateway over the last five minutes."""
    if fleet_settings().prometheus_url:
        out = GatewayFigures("prometheus")
        m = prometheus.quote(name)
        w = f"{RATE_WINDOW_S}s"
        queries = {
            "requests_per_s": f"sum(rate(llmgw_gateway_requests_total{{model={m}}}[{w}]))",
            "latency_s": f"sum(rate(llmgw_gateway_request_duration_seconds_sum{{model={m}}}[{w}]))"
            f" / sum(rate(llmgw_gateway_request_duration_seconds_count{{model={m}}}[{w}]))",
            "p95_latency_s": "histogram_quantile(0.95, sum by (le) "
            f"(rate(llmgw_gateway_request_duration_seconds_bucket{{model={m}}}[{w}])))",
            "queue": f"sum(llmgw_gateway_queue_depth{{model={m}}})",
            "tokens_per_s": "sum(rate(llmgw_gateway_tokens_total"
            f'{{model={m},kind="completion"}}[{w}]))',
            "tokens": "sum(increase(llmgw_gateway_tokens_total"
            f'{{model={m},kind="completion"}}[{w}]))',
        }
        try:
            for attr, query in queries.items():
                result = prometheus.query_range(query, now - 60, now, 60)
                points = result[0][1] if result else []
                setattr(out, attr, points[-1][1] if points else None)
        except prometheus.PrometheusError as exc:
            out.error = str(exc)
        return out
    out = GatewayFigures("history")
    try:
        rates = history.gateway_rates(name, now - RATE_WINDOW_S)
        out.requests_per_s, out.latency_s = rates.requests_per_s, rates.latency_s
        out.tokens_per_s, out.tokens = rates.tokens_per_s, rates.tokens
        queue = history.queue_points(name, now - RATE_WINDOW_S)
        out.queue = queue[-1][1] if queue else None
    except redis.RedisError as exc:
        out.error = f"the history in Redis could not be read: {exc}"
    return out


def model_detail(pk: int, now: datetime | None = None) -> ModelDetail:
    """A model's replicas, where they run and why any wait; raises Model.DoesNotExist."""
    now = now or timezone.now()
    model = Model.objects.select_related("active_profile", "canary_profile").get(pk=pk)
    replicas = (
        Replica.objects.filter(model=model)
        .select_related("profile")
        .prefetch_related(
            Prefetch("shards", queryset=Shard.objects.select_related("node").order_by("rank"))
        )
        .order_by("created_at")
    )
    lines = [
        ReplicaLine(
            r.pk,
            r.state,
            r.reason,
            r.restarts,
            r.profile.name,
            list(r.shards.all()),
            r.evict,
            r.evict_by,
            _asleep(r, now),
        )  # fmt: skip
        for r in replicas
    ]
    by_state = {s: 0 for s in ReplicaState.values}
    adapter_lines = adapters_of(model, lines)
    for r in lines:
        by_state[r.state] = by_state.get(r.state, 0) + 1
    return ModelDetail(
        model,
        lines,
        by_state,
        gateway_figures(model.name, now.timestamp()),
        scaling=scaling_status(model, by_state[ReplicaState.READY]),
        last_decision=last_decision(model),
        sleep=sleep_policy(model),
        adapters=adapter_lines,
        **canary_figures_of(model),
    )


def _asleep(replica: Replica, now: datetime) -> str:
    if replica.state != ReplicaState.ASLEEP:
        return ""
    return asleep_host_text(replica.profile, replica.shards.all(), replica.state_changed_at, now)


def adapters_of(model: Model, lines: list[ReplicaLine]) -> list[AdapterLine]:
    """Its LoRA adapters, where its replicas hold them (from the shards read already), and
    their requests and tokens: two queries, whatever the number of adapters."""
    out = {
        name: AdapterLine(name, source, [])
        for name, source in Adapter.objects.filter(model=model).values_list("name", "source")
    }
    if not out:
        return []
    for r in lines:
        for s in r.shards:
            if s.rank != 0 or s.state in ("stopped", "failed"):
                continue
            for name, got in held(s.adapters).items():
                if name in out:
                    out[name].where.append(
                        (r.id, s.node_id or "-", got.get("state", ""), got.get("error", ""))
                    )
    for name, requests, prompt, completion in (
        KeyUsage.objects.filter(model__in=list(out))
        .values("model")
        .annotate(r=Sum("requests"), p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
        .values_list("model", "r", "p", "c")
    ):
        out[name].requests, out[name].tokens = requests or 0, (prompt or 0) + (completion or 0)
    return list(out.values())
