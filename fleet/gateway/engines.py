"""What the engines say is waiting in their own queues, for the gateway's queue depth.

Engines that batch (vLLM, SGLang, llama.cpp's server) hold requests they have
accepted but not started; the gateway cannot see those, so it reads them from
each ready replica's own /metrics every few seconds. An engine that exports
none of these is left out, not counted as zero; one that has no /metrics at all
(404: llama-cpp-python's server) is asked again only after ``NO_METRICS_S``,
rather than writing a 404 into its log every few seconds.
"""

import asyncio
import logging
import time

from .http1 import UpstreamError
from .upstream import Client

logger = logging.getLogger(__name__)

# An engine that answered 404 for /metrics is not asked again for this long.
NO_METRICS_S = 600.0

# Requests accepted but not yet running, by engine.
WAITING_METRICS = (
    b"vllm:num_requests_waiting",
    b"sglang:num_queue_reqs",
    b"llamacpp:requests_deferred",
)


def parse_waiting(text: bytes) -> float | None:
    """The sum of the waiting gauges in a Prometheus exposition, or None if it has none."""
    total = None
    for line in text.splitlines():
        if not line.startswith(WAITING_METRICS):
            continue
        name, _, value = line.rpartition(b" ")
        if name.split(b"{", 1)[0].strip() not in WAITING_METRICS:
            continue  # a longer name that merely starts the same
        try:
            total = (total or 0.0) + float(value)
        except ValueError:
            continue
    return total


async def scrape(client: Client, upstreams, timeout_s: float) -> None:
    """Set ``engine_waiting`` on each upstream from its engine's /metrics.

    ``client`` bounds what is read (a scraping client's ``max_body_bytes``): an
    exposition past it, or any other failure, counts as no figure at all.
    """

    now = time.monotonic()

    async def one(up):
        body = b""
        if getattr(up, "metrics_absent_until", 0.0) > now:
            up.engine_waiting = None
            return
        try:
            async with asyncio.timeout(timeout_s):
                host, port = up.address
                resp = await client.get(host, port, "/metrics")
                try:
                    if resp.status == 200:
                        body = await resp.read()
                    elif resp.status == 404:
                        up.metrics_absent_until = now + NO_METRICS_S
                except BaseException:
                    resp.close()
                    raise
                resp.release()
        except (UpstreamError, TimeoutError) as exc:
            logger.debug("engine metrics not read url=%s: %s", up.url, exc or "timeout")
            body = b""
        up.engine_waiting = parse_waiting(body)

    await asyncio.gather(*(one(up) for up in upstreams))
