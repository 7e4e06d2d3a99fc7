"""The Prometheus registry of llmgw and the ``/metrics`` endpoint that exposes it.

Everything llmgw exports registers on ``REGISTRY``: the gateway's metrics
(``fleet.gateway.metrics``) and whoever adds more — metric objects with
``registry=REGISTRY``, or a custom collector through ``REGISTRY.register``.

The fleet gauges keep the Go system's names, so dashboards carry over; they are
exported by ``fleet.services.fleet_metrics`` and must not be reused for anything else.
"""

import hmac

from channels.db import database_sync_to_async
from django.conf import settings
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
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
)

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)

# The agents' sockets (fleet.consumers). A log reply whose asker's channel is full
# (the asker stopped reading) is dropped and counted, never fatal to the socket.
AGENT_LOGS_REPLIES_DROPPED = Counter(
    "llmgw_agent_logs_replies_dropped",
    "Agents' log replies dropped because the asker's channel-layer channel was full.",
    registry=REGISTRY,
)

# The web process's full garbage collections (llmgw_site.serve): each one stops
# every socket and request in the process for as long as it takes.
GC_FULL_PAUSE = Histogram(
    "llmgw_web_gc_full_collection_seconds",
    "How long each full (oldest-generation) garbage collection held up the web process.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)


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
