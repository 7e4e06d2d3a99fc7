"""The gateway's metrics, on the shared registry of ``fleet.metrics``.

Label children are cached per model, so a request pays for two or three
increments, not for label lookups; what is in flight is read at scrape time.
"""

import logging

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from fleet.metrics import REGISTRY

logger = logging.getLogger(__name__)

# The most tokens one answer may report, prompt or completion: a thousand times a
# long context. More, a negative count or one that is not an integer is an
# engine's fault (an overflow, a bug), not tokens served: the report is refused.
MAX_TOKENS = 10**9

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter(
    "llmgw_gateway_requests",
    'Requests answered by the gateway, by model, LoRA adapter ("" for the model itself) '
    "and HTTP status.",
    ["model", "adapter", "status"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    "llmgw_gateway_request_duration_seconds",
    "Time from the request's arrival to its last byte, by model.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
TTFT = Histogram(
    "llmgw_gateway_time_to_first_token_seconds",
    "Streamed requests: time from arrival to the first event from the engine, by model.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
UPSTREAM_ERRORS = Counter(
    "llmgw_gateway_upstream_errors",
    "Failures talking to replicas, by kind: connect, status (502/503), timeout, protocol.",
    ["model", "replica", "kind"],
    registry=REGISTRY,
)
# A canary's figures apart from the active profile's (docs/operations.md, "Canaries").
PROFILE_REQUESTS = Counter(
    "llmgw_gateway_profile_requests",
    "Requests answered by a replica, by model, its profile, and HTTP status.",
    ["model", "profile", "status"],
    registry=REGISTRY,
)
PROFILE_TTFT = Histogram(
    "llmgw_gateway_profile_time_to_first_token_seconds",
    "Streamed requests: time to the first event, by model and the replica's profile.",
    ["model", "profile"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
FALLBACKS = Counter(
    "llmgw_gateway_fallbacks",
    "Requests answered by a fallback model, by the model asked for, the fallback, and why: "
    "no_ready_replica (none past its waiting bounds) or upstream_failed (every try failed).",
    ["model", "fallback", "why"],
    registry=REGISTRY,
)
# Sleep and wake (docs/operations.md, "Sleep and wake"): what a request that found its
# model asleep waited for the wake.
WOKEN = Counter(
    "llmgw_gateway_woken_requests",
    "Requests that found their model asleep and waited for a replica to wake, by model.",
    ["model"],
    registry=REGISTRY,
)
WAKE_WAIT = Histogram(
    "llmgw_gateway_wake_wait_seconds",
    "How long a request that found its model asleep waited for a replica to wake, by model.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
RETRIES = Counter(
    "llmgw_gateway_retries",
    "Requests sent again to another replica after a connect failure or a 502/503.",
    ["model"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "llmgw_gateway_tokens",
    "Tokens through the gateway, by model and kind (prompt, completion), as the engine's "
    "usage reports them; a stream without usage counts one completion token per event.",
    ["model", "kind"],
    registry=REGISTRY,
)
USAGE_REFUSED = Counter(
    "llmgw_gateway_usage_refused",
    "Engine usage reports refused, by model: a token count that is negative, not an "
    "integer, or over 10^9; the answer counts as one that reported no usage.",
    ["model"],
    registry=REGISTRY,
)
COOLDOWNS = Counter(
    "llmgw_gateway_cooldowns",
    "Times a replica was set aside after repeated connect failures or a timeout.",
    ["model", "replica"],
    registry=REGISTRY,
)
PREFIX_ROUTES = Counter(
    "llmgw_gateway_prefix_routes",
    "Requests to models with prefix routing, by how their replica was chosen: affinity (the "
    "prefix's own), overflow (the next on the ring: the owner was over its bounded load), "
    "fallback (the least busy: the ring's choice was past the margin).",
    ["model", "result"],
    registry=REGISTRY,
)


class RouteMetrics:
    """A model's metric children, looked up once rather than on every request."""

    __slots__ = (
        "latency",
        "ttft",
        "retries",
        "statuses",
        "model",
        "base",
        "prompt",
        "completion",
        "prefix_routes",
    )

    def __init__(self, model: str, base: str = ""):
        """``model``: the name asked for; for a LoRA adapter, ``base`` is its model's, and
        requests are counted under the base with the adapter named."""
        self.model = model
        self.base = base
        self.latency = LATENCY.labels(model)
        self.ttft = TTFT.labels(model)
        self.retries = RETRIES.labels(model)
        self.prompt = TOKENS.labels(model, "prompt")
        self.completion = TOKENS.labels(model, "completion")
        self.statuses: dict[int, object] = {}
        self.prefix_routes: dict[str, object] = {}

    def prefix_routed(self, result: str) -> None:
        child = self.prefix_routes.get(result)
        if child is None:
            child = self.prefix_routes[result] = PREFIX_ROUTES.labels(self.model, result)
        child.inc()

    def tokens(self, usage: dict | None, events: int = 0) -> tuple[int, int]:
        """Count an answer's tokens: from its ``usage``, else one per streamed event
        delivered. An absurd usage (``counts``) is refused, logged and counted, and
        the answer counts as one without usage.

        Returns (prompt, completion) as counted."""
        counted = counts(usage, self.model) if usage is not None else None
        if counted is None:
            prompt, completion = 0, min(events, MAX_TOKENS)
        else:
            prompt, completion = counted
        if prompt:
            self.prompt.inc(prompt)
        if completion:
            self.completion.inc(completion)
        return prompt, completion

    def count(self, status: int) -> None:
        child = self.statuses.get(status)
        if child is None:
            model, adapter = (self.base, self.model) if self.base else (self.model, "")
            child = self.statuses[status] = REQUESTS.labels(model, adapter, str(status))
        child.inc()


# The prompt's and the completion's fields of each usage shape: OpenAI's chat and
# completions; Anthropic's Messages and OpenAI's Responses (``input_tokens``, which on
# Anthropic's leaves out the cached part, counted in its own two fields).
_OPENAI_USAGE = (("prompt_tokens",), ("completion_tokens",))
_INPUT_OUTPUT_USAGE = (
    ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"),
    ("output_tokens",),
)


def counts(usage, model: str) -> tuple[int, int] | None:
    """(prompt, completion) tokens of an engine's ``usage`` object, in OpenAI's shape or
    in the Messages and Responses APIs'; a count it leaves out (embeddings have no
    completion) is 0. None where there is no object, or where a count is not an
    integer from 0 to ``MAX_TOKENS`` (refused: logged and counted)."""
    if usage.__class__ is not dict:
        return None
    shape = _OPENAI_USAGE
    if "prompt_tokens" not in usage and ("input_tokens" in usage or "output_tokens" in usage):
        shape = _INPUT_OUTPUT_USAGE
    out = []
    for names in shape:
        total = 0
        for name in names:
            value = _count(usage, name, model)
            if value is None:
                return None
            total += value
        if total > MAX_TOKENS:
            return _refused(model, names[0], total)
        out.append(total)
    return out[0], out[1]


def _count(usage: dict, name: str, model: str) -> int | None:
    value = usage.get(name)
    if value is None:
        return 0
    if value.__class__ is not int or not 0 <= value <= MAX_TOKENS:
        return _refused(model, name, value)
    return value


def _refused(model: str, name: str, value) -> None:
    USAGE_REFUSED.labels(model).inc()
    logger.warning(
        "engine usage refused model=%s %s=%.40r: not an integer from 0 to %d; "
        "the answer counts as one without usage",
        model,
        name,
        value,
        MAX_TOKENS,
    )


def upstream_error(model: str, replica: str, kind: str) -> None:
    UPSTREAM_ERRORS.labels(model, replica, kind).inc()


def count_unrouted(status: int) -> None:
    """A request refused before it named a known model: counted under model "-".

    Model names from unauthenticated clients never become labels, so nobody can
    grow the registry by inventing names.
    """
    REQUESTS.labels("-", "", str(status)).inc()


class InFlightCollector:
    """In flight per replica and per model, read from the gateways' own counters at scrape time.

    The routing table counts outstanding requests anyway (it routes by them);
    reading them when Prometheus asks costs requests nothing. ``gateways`` lists
    this process's gateways (``state.live_gateways``, which registers this).
    """

    def __init__(self, gateways):
        self.gateways = gateways

    def collect(self):
        in_flight = GaugeMetricFamily(
            "llmgw_gateway_in_flight_requests",
            "Requests being served by each replica through this gateway process.",
            labels=["model", "replica"],
        )
        queue = GaugeMetricFamily(
            "llmgw_gateway_queue_depth",
            "Requests in flight at this gateway process for each model, plus those waiting "
            "inside its engines where they export it.",
            labels=["model"],
        )
        waiting = GaugeMetricFamily(
            "llmgw_gateway_waiting_requests",
            "Requests waiting at this gateway process for a model's first ready replica "
            "(autoscaled models: scale to zero and back).",
            labels=["model"],
        )
        per_model: dict[str, float] = {}
        waits: dict[str, int] = {}
        for gw in self.gateways():
            for model, n in list(gw.waiting.items()):
                waits[model] = waits.get(model, 0) + n
            for model in list(gw.routes):
                per_model.setdefault(model, 0)
            for model, up in gw.upstreams_in_service():
                in_flight.add_metric([model, up.replica_id], up.outstanding)
                per_model[model] = per_model.get(model, 0) + up.outstanding
            for route in list(gw.routes.values()):
                for up in route.upstreams:
                    if up.engine_waiting:
                        per_model[route.name] += up.engine_waiting
        for model, n in sorted(per_model.items()):
            queue.add_metric([model], n)
        for model, n in sorted(waits.items()):
            waiting.add_metric([model], n)
        yield in_flight
        yield queue
        yield waiting


def register_in_flight(gateways) -> None:
    REGISTRY.register(InFlightCollector(gateways))


def model_figures(gateways) -> dict[str, tuple[float, float, float, float, float]]:
    """{model: (queue depth, requests answered, latency seconds summed, latencies counted,
    completion tokens)}.

    What this process's gateways count, read as /metrics reads it, for the
    console's history (``fleet.services.history.record_gateway``).
    """
    figures: dict[str, list[float]] = {}
    for family in InFlightCollector(gateways).collect():
        if family.name == "llmgw_gateway_queue_depth":
            for sample in family.samples:
                figures.setdefault(sample.labels["model"], [0.0] * 5)[0] = sample.value
    for family in REQUESTS.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels["model"] in figures:
                figures[sample.labels["model"]][1] += sample.value
    for family in LATENCY.collect():
        for sample in family.samples:
            model = sample.labels.get("model")
            if model in figures and sample.name.endswith("_sum"):
                figures[model][2] = sample.value
            elif model in figures and sample.name.endswith("_count"):
                figures[model][3] = sample.value
    for family in TOKENS.collect():
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name.endswith("_total")
                and labels["model"] in figures
                and labels["kind"] == "completion"
            ):
                figures[labels["model"]][4] = sample.value
    return {model: tuple(values) for model, values in figures.items()}
