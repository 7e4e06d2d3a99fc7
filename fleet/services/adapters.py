"""LoRA adapters: which ones each replica holds, and what the gateways asked for.

A replica of a model holds at most its profile's ``max_adapters`` of the model's
adapters: the ones asked for most recently, then the ones never asked for, by
name (``wanted``). Its node hears of them in the desired set
(``fleet.services.desired``); the agent fetches, loads and unloads them, and
reports what its engine holds on the shard (``Shard.adapters``), which the
gateways route by.

A request for an adapter no ready replica holds waits at the gateway, which
reports that demand like a model's (``fleet.services.autoscaler.load``). The
reconciler's pass records when each adapter was last asked for (``step``); when
that changes which adapters a model's replicas should hold, the least recently
used one makes way and the nodes running the model are rung.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from agentd import protocol
from fleet.models import Adapter, Shard, ShardState

logger = logging.getLogger(__name__)


def _order(a: Adapter) -> tuple:
    seen = a.last_request_at
    # Most recently asked for first; never asked for last, by name.
    return (seen is None, -(seen.timestamp() if seen else 0), a.name)


def wanted(adapters: Iterable[Adapter], limit: int) -> list[Adapter]:
    """The ``limit`` adapters a replica should hold, most recently asked for first."""
    return sorted(adapters, key=_order)[:limit] if limit > 0 else []


def by_model(model_ids: Iterable[int]) -> dict[int, list[Adapter]]:
    """Each model's adapters, in one query."""
    out: dict[int, list[Adapter]] = {}
    for a in Adapter.objects.filter(model_id__in=set(model_ids)):
        out.setdefault(a.model_id, []).append(a)
    return out


def specs(adapters: Iterable[Adapter], limit: int) -> list[protocol.AdapterSpec]:
    return [
        protocol.AdapterSpec(name=a.name, source=a.source, sha256=dict(a.sha256 or {}))
        for a in wanted(adapters, limit)
    ]


def _live_shards(model_ids) -> list[tuple[str, int, int]]:
    """(node, model, the profile's max_adapters) of every shard of these models not finished."""
    rows = (
        Shard.objects.filter(replica__model_id__in=list(model_ids), node__isnull=False)
        .exclude(state__in=[ShardState.STOPPED, ShardState.FAILED])
        .values_list("node_id", "replica__model_id", "spec")
    )
    return [
        (n, m, ((spec or {}).get("profile") or {}).get("max_adapters", 0)) for n, m, spec in rows
    ]


def nodes_of(model_ids: Iterable[int]) -> set[str]:
    """The nodes whose desired sets carry these models' adapters: after a change (an
    adapter added, removed, given a new source) they get a new version."""
    return {n for n, _m, limit in _live_shards(model_ids) if limit}


def step(now: datetime) -> set[str]:
    """Record when each adapter was last asked for, from the gateways' reports. Returns
    the nodes of models whose replicas should now hold other adapters, to be given a new
    desired set. A fleet without adapters pays one query, and no Redis read."""
    from .autoscaler.step import read_loads

    if not Adapter.objects.exists():
        return set()
    loads = read_loads(now)
    if not loads:
        return set()
    asked = Adapter.objects.filter(name__in=list(loads))
    moved: dict[int, list[tuple[Adapter, datetime]]] = {}
    for a in asked:
        figures = loads[a.name]
        seen = figures.last_request
        if figures.waiting:
            seen = now.timestamp()
        if seen is None:
            continue
        at = min(now, datetime.fromtimestamp(seen, tz=now.tzinfo))
        if a.last_request_at is None or at - a.last_request_at >= timedelta(seconds=1):
            moved.setdefault(a.model_id, []).append((a, at))
    if not moved:
        return set()
    everyone = by_model(moved)
    limits: dict[int, set[int]] = {}
    shards = _live_shards(moved)
    for _n, model_id, limit in shards:
        if limit:
            limits.setdefault(model_id, set()).add(limit)
    ring: set[int] = set()
    for model_id, times in moved.items():
        before = everyone.get(model_id, [])
        sets_before = {n: {a.name for a in wanted(before, n)} for n in limits.get(model_id, ())}
        new_times = {a.pk: at for a, at in times}
        for a in before:
            a.last_request_at = new_times.get(a.pk, a.last_request_at)
        for a, at in times:
            Adapter.objects.filter(pk=a.pk).update(last_request_at=at)
        if any({a.name for a in wanted(before, n)} != names for n, names in sets_before.items()):
            ring.add(model_id)
            logger.info(
                "adapters model=%s asked for: %s; replicas now hold the most recent of %s",
                model_id,
                ", ".join(a.name for a, _at in times),
                ", ".join(a.name for a in wanted(before, max(limits[model_id]))),
            )
    return {n for n, m, limit in shards if m in ring and limit}


def held(shard_adapters: list) -> dict[str, dict]:
    """A shard's report, by adapter name (``Shard.adapters``)."""
    return {a.get("name", ""): a for a in shard_adapters or [] if isinstance(a, dict)}


def where(adapter: Adapter) -> list[tuple[str, str, str, str]]:
    """(replica, node, state, error) for each serving shard of its base that reports it."""
    rows = (
        Shard.objects.filter(replica__model_id=adapter.model_id, rank=0)
        .exclude(state__in=[ShardState.STOPPED, ShardState.FAILED])
        .values_list("replica_id", "node_id", "adapters")
    )
    out = []
    for replica, node, reported in rows:
        got = held(reported).get(adapter.name)
        if got:
            out.append((replica, node or "-", got.get("state", ""), got.get("error", "")))
    return out


def where_text(adapter: Adapter) -> str:
    """Where it is loaded, for the admin: "loaded on cpu-a (replica 1a2b3c4d)", or why not."""
    parts = [
        f"{state} on {node} (replica {replica[:8]})" + (f": {error}" if error else "")
        for replica, node, state, error in where(adapter)
    ]
    return "; ".join(parts) or "not loaded"
