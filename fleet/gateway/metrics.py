"""The gateway's metrics, on the shared registry of ``fleet.metrics``.

Label children are cached on the route and upstream objects, so a request pays
for a few increments, not for label lookups.
"""

from prometheus_client import Counter, Gauge, Histogram

from fleet.metrics import REGISTRY

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter(
    "llmgw_gateway_requests",
    "Requests answered by the gateway, by model and HTTP status.",
    ["model", "status"],
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
IN_FLIGHT = Gauge(
    "llmgw_gateway_in_flight_requests",
    "Requests being served by each replica through this gateway process.",
    ["model", "replica"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "llmgw_gateway_queue_depth",
    "Requests in flight at this gateway process for each model (the engines' own "
    "queues are not included).",
    ["model"],
    registry=REGISTRY,
)
UPSTREAM_ERRORS = Counter(
    "llmgw_gateway_upstream_errors",
    "Failures talking to replicas, by kind: connect, status (502/503), timeout, protocol.",
    ["model", "replica", "kind"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "llmgw_gateway_retries",
    "Requests sent again to another replica after a connect failure or a 502/503.",
    ["model"],
    registry=REGISTRY,
)
COOLDOWNS = Counter(
    "llmgw_gateway_cooldowns",
    "Times a replica was set aside after repeated connect failures.",
    ["model", "replica"],
    registry=REGISTRY,
)


class RouteMetrics:
    __slots__ = ("latency", "ttft", "queue", "retries", "statuses", "model")

    def __init__(self, model: str):
        self.model = model
        self.latency = LATENCY.labels(model)
        self.ttft = TTFT.labels(model)
        self.queue = QUEUE_DEPTH.labels(model)
        self.retries = RETRIES.labels(model)
        self.statuses: dict[int, object] = {}

    def count(self, status: int) -> None:
        child = self.statuses.get(status)
        if child is None:
            child = self.statuses[status] = REQUESTS.labels(self.model, str(status))
        child.inc()


class UpstreamMetrics:
    __slots__ = ("in_flight", "model", "replica")

    def __init__(self, model: str, replica: str):
        self.model, self.replica = model, replica
        self.in_flight = IN_FLIGHT.labels(model, replica)

    def error(self, kind: str) -> None:
        UPSTREAM_ERRORS.labels(self.model, self.replica, kind).inc()


def count_unrouted(status: int) -> None:
    """A request refused before it named a known model: counted under model "-".

    Model names from unauthenticated clients never become labels, so nobody can
    grow the registry by inventing names.
    """
    REQUESTS.labels("-", str(status)).inc()


def forget_replica(model: str, replica: str) -> None:
    try:
        IN_FLIGHT.remove(model, replica)
    except KeyError:
        pass
