"""Waiting for a replica, and the load each gateway process reports for the autoscaler.

A request for an autoscaled model (``Route.waits``) that finds no ready replica
does not get a 503 at once: it counts itself as waiting, the process reports
that demand to Redis at once and asks for a reconciler pass (which starts a
replica of a model scaled to zero), and the request waits until the routing
table has a ready replica (``routes_changed``, called on every reload), within
two bounds: at most ``max_waiting`` requests per model in this process, and at
most ``max_wait_s`` each (the model's, else ``LLMGW_GATEWAY_WAIT_QUEUE`` and
``LLMGW_GATEWAY_WAIT_TIMEOUT_S``). Past either, a 503 with Retry-After in
OpenAI's shape. A streamed request that waits longer than
``LLMGW_GATEWAY_WAIT_COMMENT_S`` gets its 200 and an SSE comment then, and again
at that interval, so proxies in between keep the connection; past the wait
bound it then ends with an error event instead of a 503.

The report (``report_load``, one task per process): in flight per autoscaled
model, averaged over the interval, requests waiting, and the time of the last
request, as one Redis key (``fleet.services.autoscaler.load``). A request costs
one dict assignment for it (``Gateway.last_request``).
"""

import asyncio
import logging
import os
import socket
import time

from fleet.conf import fleet_settings
from fleet.services import canary_figures
from fleet.services.autoscaler import load

from .errors import GatewayError

logger = logging.getLogger(__name__)

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
COMMENT = b": waiting for a replica\n\n"
# While requests wait, the reconciler is asked again this often, in case an ask was lost.
ASK_AGAIN_S = 3.0
SAMPLES = 4  # in-flight samples averaged per report


async def wait_for_replica(gw, route, req, reply):
    """The model's route once it has a ready replica; GatewayError 503 past the bounds."""
    c = fleet_settings()
    name = route.name
    bound = route.max_waiting if route.max_waiting is not None else c.gateway_wait_queue
    limit = float(route.max_wait_s or c.gateway_wait_timeout_s)
    already = gw.waiting.get(name, 0)
    if already >= bound:
        raise GatewayError(
            503,
            f"model '{name}' has no ready replica and {already} requests are waiting for one "
            f"already, the most this gateway holds; try again shortly",
            code="too_many_waiting",
            retry_after=5,
        )
    gw.waiting[name] = already + 1
    gw.demand()
    stream = req.body.get("stream") is True
    every = max(0.05, c.gateway_wait_comment_s)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    try:
        while True:
            current = gw.routes.get(name)
            if current is None:
                raise GatewayError(
                    404, f"model '{name}' does not exist", param="model", code="model_not_found"
                )
            if current.upstreams:
                return current
            if not current.waits:
                raise GatewayError(
                    503,
                    current.unavailable,
                    code="no_ready_replica",
                    retry_after=current.retry_after,
                )
            left = deadline - loop.time()
            if left <= 0:
                raise GatewayError(
                    503,
                    f"{current.unavailable} (waited {limit:g} s)",
                    code="no_ready_replica",
                    retry_after=current.retry_after,
                )
            event = gw.replica_ready.setdefault(name, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), min(left, every) if stream else left)
            except TimeoutError:
                if stream and loop.time() < deadline:
                    if not reply.started:
                        await reply.start(200, list(SSE_HEADERS))
                        reply.sse_open = True
                    await reply.send(
                        {"type": "http.response.body", "body": COMMENT, "more_body": True}
                    )
    finally:
        left_waiting = gw.waiting.get(name, 1) - 1
        if left_waiting > 0:
            gw.waiting[name] = left_waiting
        else:
            gw.waiting.pop(name, None)


def routes_changed(gw) -> None:
    """After a reload: wake the requests waiting for a model that has a replica now (or is gone)."""
    for name, event in list(gw.replica_ready.items()):
        route = gw.routes.get(name)
        if route is None or route.upstreams or not route.waits:
            event.set()
            del gw.replica_ready[name]


def _figures(gw, sums: dict[str, float], samples: int) -> dict[str, tuple]:
    """{model: (in flight, waiting for a replica, last request, waiting in the fair queue)}:
    every autoscaled or sleeping model, and any other while its interactive requests
    queue (a batch's lines pause for them: fleet.services.batches.pause). Batch lines
    are not demand: not in flight here, though a model running them is not idle."""
    now_wall, now_pc = time.time(), time.perf_counter()
    out = {}
    queues = gw.fair.queues
    for route in list(gw.routes.values()):
        queue = queues.get(route.name)
        queued = queue.size if queue is not None else 0
        if not route.waits and not queued:
            continue
        seen = gw.last_request.get(route.name)
        in_flight = sums.get(route.name, 0.0) / max(1, samples)
        waiting = gw.waiting.get(route.name, 0)
        # A model is not idle while it answers or someone waits: a long answer
        # counts until its end, not from its arrival.
        busy = in_flight or waiting or queued or any(u.batch_outstanding for u in route.upstreams)
        last = now_wall if busy else None
        if last is None and seen is not None:
            last = now_wall - (now_pc - seen)
        out[route.name] = (
            round(in_flight, 3),
            waiting,
            None if last is None else round(last, 3),
            queued,
        )
    return out


def _sample(gw, sums: dict[str, float]) -> None:
    for route in list(gw.routes.values()):
        if route.waits:
            in_flight = sum(u.outstanding - u.batch_outstanding for u in route.upstreams)
            sums[route.name] = sums.get(route.name, 0.0) + max(0, in_flight)


async def _report_canaries(gw, source: str) -> None:
    """This process's answers per profile of each canary, for the reconciler's judgement
    (fleet.services.canary_figures); a canary no longer running is forgotten."""
    running = {(r.name, r.canary_profile_id) for r in gw.routes.values() if r.canary_percent}
    for key in [k for k in gw.canary_counts if k not in running]:
        del gw.canary_counts[key]
    if not gw.canary_counts:
        return
    bodies = canary_figures.encode(gw.canary_counts)
    try:
        await asyncio.to_thread(canary_figures.write, source, bodies)
    except Exception as exc:  # noqa: BLE001 - Redis away: the canary is judged later
        logger.warning("gateway cannot report its canary figures: %s", exc)


async def report_load(gw) -> None:
    """The process's task: sample in flight, report every interval (at once on demand)."""
    from fleet.services.reconciler.ask import request_reconcile_now

    source = f"{socket.gethostname()}:{os.getpid()}:{id(gw):x}"
    sums: dict[str, float] = {}
    samples = 0
    last_report = 0.0
    last_ask = 0.0
    failing = False
    while True:
        every = fleet_settings().gateway_load_report_s
        try:
            await asyncio.wait_for(gw.demand_event.wait(), every / SAMPLES)
        except TimeoutError:
            pass
        urgent = gw.demand_event.is_set()
        gw.demand_event.clear()
        _sample(gw, sums)
        samples += 1
        now = time.monotonic()
        if not urgent and now - last_report < every:
            continue
        figures = _figures(gw, sums, samples)
        sums, samples, last_report = {}, 0, now
        await _report_canaries(gw, source)
        if not figures:
            continue
        try:
            await asyncio.to_thread(load.write, source, figures)
            if any(f[1] for f in figures.values()) and (urgent or now - last_ask > ASK_AGAIN_S):
                last_ask = now
                await asyncio.to_thread(request_reconcile_now)
            if failing:
                logger.info("gateway reports its load again")
                failing = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Redis away: the autoscaler holds still
            if not failing:
                logger.warning("gateway cannot report its load for the autoscaler: %s", exc)
                failing = True
