"""The Prometheus registry of llmgw and the ``/metrics`` endpoint that exposes it.

Everything llmgw exports registers on ``REGISTRY``: the gateway's metrics
(``fleet.gateway.metrics``) and whoever adds more — metric objects with
``registry=REGISTRY``, or a custom collector through ``REGISTRY.register``.

The fleet gauges keep the Go system's names, so dashboards carry over; they are
exported by ``fleet.services.fleet_metrics`` and must not be reused for anything else.
"""

import bisect
import hmac

from channels.db import database_sync_to_async
from django.conf import settings
from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

FLEET_GAUGES = (
    "llmgw_node_cpu_utilization_percent",
    "llmgw_node_cpus",
    "llmgw_node_load",
    "llmgw_node_memory_bytes",
    "llmgw_node_memory_used_bytes",
    "llmgw_node_memory_available_bytes",
    "llmgw_shard_cpu_cores",
    "llmgw_shard_memory_bytes",
    "llmgw_shard_gpu_memory_bytes",
    "llmgw_shard_gpu_memory_budget_bytes",
    "llmgw_shard_over_gpu_budget",
)

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)

# The agents' sockets (fleet.sockets.consumer). A log reply whose asker's channel is full
# (the asker stopped reading) is dropped and counted, never fatal to the socket.
AGENT_LOGS_REPLIES_DROPPED = Counter(
    "llmgw_agent_logs_replies_dropped",
    "Agents' log replies dropped because the asker's channel-layer channel was full.",
    registry=REGISTRY,
)


# Agents told to come back later at the handshake (fleet.sockets.admission.turned_away):
# a web process with more agents knocking than it takes through registration at once
# ("busy", LLMGW_AGENT_HANDSHAKES_MAX), or a credential check that waited past the
# agent's own wait ("slow_check").
AGENT_HANDSHAKES_TURNED_AWAY = Counter(
    "llmgw_agent_handshakes_turned_away",
    "Agent handshakes told to come back later (503 with Retry-After, or closed with 4013).",
    ["why"],
    registry=REGISTRY,
)


class FullCollections:
    """The web process's full garbage collections (llmgw_site.serve), as a histogram.

    Each one stops every socket and request in the process for as long as it
    takes. Counted from a ``gc.callbacks`` hook, where taking a lock (as
    prometheus-client's metric objects do) could deadlock a thread that the
    collection interrupted while it held that lock (prometheus/client_python#363):
    so plain numbers here, read at scrape time. Exported only by a process that
    ``enable()``d it; Daphne's would read as "no collections".
    """

    NAME = "llmgw_web_gc_full_collection_seconds"
    BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(self):
        self.enabled = False
        self.counts = [0] * (len(self.BUCKETS) + 1)  # the last: over the largest bucket
        self.total_s = 0.0

    def enable(self) -> None:
        self.enabled = True

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self.BUCKETS, seconds)
        self.counts[i] += 1
        self.total_s += seconds

    def collect(self):
        if not self.enabled:
            return
        running, buckets = 0, []
        for bound, n in zip((*self.BUCKETS, float("inf")), self.counts, strict=True):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
        yield HistogramMetricFamily(
            self.NAME,
            "How long each full (oldest-generation) garbage collection held up the web process.",
            buckets=buckets,
            sum_value=self.total_s,
        )


GC_FULL_PAUSE = FullCollections()
REGISTRY.register(GC_FULL_PAUSE)


def render() -> bytes:
    return generate_latest(REGISTRY)


def _authorized(scope) -> bool:
    """Whether the request carries settings.METRICS_TOKEN, or none is set (open)."""
    from fleet.models.access import bearer_secret  # fleet.metrics loads before the models

    token = settings.METRICS_TOKEN
    if not token:
        return True
    try:
        secret = bearer_secret(scope["headers"])
    except ValueError:
        return False
    return secret is not None and hmac.compare_digest(secret.encode(), token.encode())


async def metrics_app(scope, receive, send) -> None:
    """ASGI app for GET /metrics."""
    if scope["method"] not in ("GET", "HEAD"):
        await send(
            {
                "type": "http.response.start",
                "status": 405,
                "headers": [(b"allow", b"GET, HEAD"), (b"content-type", b"text/plain")],
            }
        )
        await send({"type": "http.response.body", "body": b"use GET\n"})
        return
    if not _authorized(scope):
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"www-authenticate", b"Bearer"), (b"content-type", b"text/plain")],
            }
        )
        await send({"type": "http.response.body", "body": b"/metrics needs its bearer token\n"})
        return
    # In a thread: a collector someone adds may read the database, and nothing
    # may block the event loop that serves requests.
    body = await database_sync_to_async(render)()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", CONTENT_TYPE_LATEST.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
