"""An hour of each node's load, kept by the control plane from heartbeats, in Redis.

Node charts read Prometheus when one is configured (``fleet.services.charts``);
without one, this is where their points come from, so charts work on the
embedded default. Heartbeats are the hot path, so recording is cheap: at most
one point per node per ``LLMGW_HISTORY_STEP_S`` (remembered in this process,
no read), and one pipelined round trip for a whole batch of heartbeats. Each
node's points are a Redis list trimmed to an hour's worth and expiring an hour
after the last one, so a node that went away leaves nothing behind.

The gateways record their figures per model the same way
(``record_gateway``: queue depth, requests, latency), one list per model,
each point naming the gateway process that measured it; readers take
differences per process and add the processes up.

Redis being away never fails a heartbeat: the points are lost, a warning is
logged once, and recording is skipped for a while rather than waiting on a
dead connection every batch.
"""

import json
import logging
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import redis
from django.conf import settings

from agentd import protocol
from fleet.conf import fleet_settings

from .reconciler.lock import prefix

logger = logging.getLogger(__name__)

HOUR_S = 3600
# After Redis fails, recording is skipped this long instead of timing out on every batch.
BACKOFF_S = 30.0

_client: redis.Redis | None = None
_guard = threading.Lock()
_last_point: dict[str, float] = {}  # node id -> time of its last point (this process)
_last_queue: dict[str, float] = {}  # model -> time of its last gateway point (this process)
_down_until = 0.0


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        # Short timeouts: the heartbeat writer waits for this.
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5
        )
    return _client


def node_key(node_id: str) -> str:
    return f"{prefix()}:history:node:{node_id}"


def gateway_key(model: str) -> str:
    return f"{prefix()}:history:gateway:{model}"


def points_kept() -> int:
    """How many points an hour holds at one per step, plus one for the edge."""
    return math.ceil(HOUR_S / max(1.0, fleet_settings().history_step_s)) + 1


def _point(load: protocol.Load, at: datetime) -> dict:
    return {
        "t": round(at.timestamp(), 1),
        "c": load.cpu_percent,
        "n": load.cpu_count,
        "l": [load.load1, load.load5, load.load15],
        "u": load.memory_used_bytes,
        "a": load.memory_available_bytes,
        "s": [[s.shard_id, s.cpu_cores, s.rss_bytes] for s in load.shards],
    }


def _push(items: list[tuple[str, str]], memo: dict, stamps: dict) -> int:
    """RPUSH each (key, value), trim and expire, in one pipeline; then remember the stamps."""
    global _down_until
    keep = points_kept()
    pipe = _redis().pipeline(transaction=False)
    for key, value in items:
        pipe.rpush(key, value)
        pipe.ltrim(key, -keep, -1)
        pipe.expire(key, HOUR_S + 60)
    try:
        pipe.execute()
    except redis.RedisError as exc:
        with _guard:
            first = _down_until == 0.0
            _down_until = time.monotonic() + BACKOFF_S
        if first:
            logger.warning("history: Redis did not take the points, skipping for a while: %s", exc)
        return 0
    with _guard:
        if _down_until:
            logger.info("history: Redis takes points again")
        _down_until = 0.0
        memo.update(stamps)
    return len(items)


def _paused() -> bool:
    return _down_until > time.monotonic()


def record_loads(loads: Iterable[tuple[str, protocol.Load, datetime]]) -> int:
    """Keep a point for each node whose last one is a step old; returns how many were kept.

    ``loads`` holds (node id, load, arrival time), as heartbeats bring them.
    """
    if _paused():
        return 0
    step = fleet_settings().history_step_s
    items, stamps = [], {}
    for node_id, load, at in loads:
        t = at.timestamp()
        if t - stamps.get(node_id, _last_point.get(node_id, 0.0)) < step:
            continue
        stamps[node_id] = t
        items.append((node_key(node_id), json.dumps(_point(load, at), separators=(",", ":"))))
    if not items:
        return 0
    return _push(items, _last_point, stamps)


def record_gateway(figures: dict[str, tuple], source: str, at: float | None = None) -> int:
    """A gateway process's figures per model, at most one point per model per step.

    ``figures``: {model: (queue depth, requests answered, latency seconds summed,
    latencies counted[, completion tokens])}, the counters as this process has counted them since it
    started; ``source`` names the process, so readers can take differences per
    process and add the processes up.
    """
    if _paused() or not figures:
        return 0
    at = time.time() if at is None else at
    step = fleet_settings().history_step_s
    items, stamps = [], {}
    for model, (depth, requests, lat_sum, lat_count, *tokens) in figures.items():
        if at - _last_queue.get(model, 0.0) < step:
            continue
        stamps[model] = at
        point = [round(at, 1), source, depth, requests, lat_sum, lat_count, *tokens[:1]]
        items.append((gateway_key(model), json.dumps(point)))
    if not items:
        return 0
    return _push(items, _last_queue, stamps)


def _read(key: str) -> list:
    raw = _redis().lrange(key, 0, -1)
    out = []
    for item in raw:
        try:
            out.append(json.loads(item))
        except ValueError:
            continue
    return out


def node_points(node_id: str, since: float) -> list[dict]:
    """The node's points since ``since`` (a Unix time), oldest first. Raises redis.RedisError."""
    return [p for p in _read(node_key(node_id)) if isinstance(p, dict) and p.get("t", 0) >= since]


def _gateway_points(model: str, since: float) -> list[list]:
    return [
        p
        for p in _read(gateway_key(model))
        # Six figures; a seventh, completion tokens, from gateways that count them.
        if isinstance(p, list) and len(p) in (6, 7) and p[0] >= since
    ]


def queue_points(model: str, since: float) -> list[tuple[float, float]]:
    """The model's queue depth over time, every gateway process's added up, one per step."""
    step = fleet_settings().history_step_s
    buckets: dict[int, dict[str, float]] = {}
    for t, source, depth, *_ in _gateway_points(model, since):
        # The newest figure of each process within a step.
        buckets.setdefault(int(t // step), {})[str(source)] = float(depth)
    return [(b * step, sum(per.values())) for b, per in sorted(buckets.items())]


@dataclass(frozen=True)
class GatewayRates:
    """A model's figures through the gateways over a window; None where none can be taken."""

    requests_per_s: float | None = None
    latency_s: float | None = None
    tokens_per_s: float | None = None
    tokens: float | None = None


def gateway_rates(model: str, since: float) -> GatewayRates:
    """Requests and completion tokens a second, mean latency, since ``since``, every process
    added up.

    None where there is no difference to take: fewer than two points of any
    process, no request in the window for the latency, no token counted by a
    gateway that counts them.
    """
    first: dict[str, list] = {}
    last: dict[str, list] = {}
    for p in _gateway_points(model, since):
        first.setdefault(str(p[1]), p)
        last[str(p[1])] = p
    rate, spans, lat_sum, lat_n = 0.0, 0, 0.0, 0.0
    token_rate, tokens, token_spans = 0.0, 0.0, 0
    for source, a in first.items():
        b = last[source]
        if b[0] <= a[0] or b[3] < a[3]:
            continue  # one point, or the process restarted (its counters did)
        rate += (b[3] - a[3]) / (b[0] - a[0])
        spans += 1
        lat_sum += b[4] - a[4]
        lat_n += b[5] - a[5]
        if len(a) == len(b) == 7 and b[6] >= a[6]:
            tokens += b[6] - a[6]
            token_rate += (b[6] - a[6]) / (b[0] - a[0])
            token_spans += 1
    return GatewayRates(
        rate if spans else None,
        lat_sum / lat_n if lat_n > 0 else None,
        token_rate if token_spans else None,
        tokens if token_spans else None,
    )


def forget() -> None:
    """Drop every point this installation kept, and this process's memos (tests, resets)."""
    global _down_until
    client = _redis()
    keys = list(client.scan_iter(match=f"{prefix()}:history:*", count=1000))
    if keys:
        client.delete(*keys)
    with _guard:
        _last_point.clear()
        _last_queue.clear()
        _down_until = 0.0
