"""What the gateways report for the autoscaler, through Redis: load and demand per model.

Each gateway process knows only its own requests: in flight per replica, those
waiting for a replica, and when it last saw a request for each model. Every
``LLMGW_GATEWAY_LOAD_REPORT_S`` (and at once when a request starts waiting)
it writes them as one Redis key of its own, expiring after
``LLMGW_GATEWAY_LOAD_TTL_S``, and names itself in a sorted set by time. The
reconciler reads every live process's report in one round trip and adds them
up (``read``): a process that died stops counting when its key expires. No
request writes anything; the database is written by the reconciler, and only
when a figure it keeps on the model changes.
"""

import json
import logging
import time
from dataclasses import dataclass

import redis
from django.conf import settings

from fleet.conf import fleet_settings

from ..reconciler.lock import prefix

logger = logging.getLogger(__name__)

_client: redis.Redis | None = None


def figures_redis() -> redis.Redis:
    """The Redis client the live load figures are kept in; the canaries' figures too.

    Short timeouts: a figure not written is a figure missed, never a stalled pass.
    """
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1
        )
    return _client


def _index() -> str:
    return f"{prefix()}:gwload"


def _key(source: str) -> str:
    return f"{prefix()}:gwload:{source}"


@dataclass
class ModelLoad:
    """One model's figures, every gateway process added up."""

    outstanding: float = 0.0  # in flight, averaged over each process's last report interval
    waiting: int = 0  # waiting for a replica now
    queued: int = 0  # waiting in a gateway's fair queue for room on a busy replica
    last_request: float | None = None  # Unix time of the newest request any process saw


def write(source: str, models: dict[str, tuple], now=None) -> None:
    """This process's report: {model: (in flight, waiting, last request as Unix time,
    queued)}.

    Raises redis.RedisError; the caller logs it once and tries again next time.
    """
    now = time.time() if now is None else now
    ttl = fleet_settings().gateway_load_ttl_s
    body = json.dumps({"t": round(now, 3), "m": models}, separators=(",", ":"))
    pipe = figures_redis().pipeline(transaction=False)
    pipe.set(_key(source), body, px=int(ttl * 1000))
    pipe.zadd(_index(), {source: now})
    pipe.zremrangebyscore(_index(), "-inf", now - ttl)
    pipe.execute()


def read(now=None) -> dict[str, ModelLoad]:
    """Every live gateway process's report, added up per model. Raises redis.RedisError."""
    now = time.time() if now is None else now
    ttl = fleet_settings().gateway_load_ttl_s
    client = figures_redis()
    sources = client.zrangebyscore(_index(), now - ttl, "+inf")
    if not sources:
        return {}
    loads: dict[str, ModelLoad] = {}
    for raw in client.mget([_key(s.decode()) for s in sources]):
        if raw is None:
            continue
        try:
            report = json.loads(raw)
            models = report["m"]
            for model, (outstanding, waiting, last, *more) in models.items():
                load = loads.setdefault(model, ModelLoad())
                load.outstanding += float(outstanding)
                load.waiting += int(waiting)
                load.queued += int(more[0]) if more else 0  # a gateway before it had none
                if last is not None and (load.last_request is None or last > load.last_request):
                    load.last_request = float(last)
        except (ValueError, TypeError, KeyError, AttributeError):
            logger.warning("autoscaler: a gateway load report could not be read: %r", raw[:200])
    return loads


def forget() -> None:
    """Drop every report (tests)."""
    client = figures_redis()
    keys = list(client.scan_iter(match=f"{prefix()}:gwload*", count=1000))
    if keys:
        client.delete(*keys)
