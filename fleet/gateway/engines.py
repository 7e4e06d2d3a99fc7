"""What the engines say is waiting in their own queues, for the gateway's queue depth.

Engines that batch (vLLM, SGLang, llama.cpp's server) hold requests they have
accepted but not started; the gateway cannot see those, so it reads them from
each ready replica's own /metrics every few seconds. An engine that exports
none of these is left out, not counted as zero.
"""

import asyncio
import logging

import aiohttp

logger = logging.getLogger(__name__)

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


async def scrape(session: aiohttp.ClientSession, upstreams, timeout_s: float) -> None:
    """Set ``engine_waiting`` on each upstream from its engine's /metrics."""

    async def one(up):
        try:
            async with asyncio.timeout(timeout_s):
                async with session.get(f"{up.url}/metrics") as resp:
                    body = await resp.read() if resp.status == 200 else b""
        except (aiohttp.ClientError, TimeoutError, OSError):
            body = b""
        up.engine_waiting = parse_waiting(body)

    await asyncio.gather(*(one(up) for up in upstreams))
