"""Counting what each replica holds into the hour's CostHour rows, and closing past hours.

Every ``LLMGW_COST_INTERVAL_S`` beat runs ``accrue``: the seconds since the last
count (``FleetStatus.cost_accrued_at``; at most ``LLMGW_COST_GAP_MAX_S``, so a
control plane stopped for a while does not invent what ran while nobody
looked) times what each owner holds now (``attribution.attribute``), added to
the rows of the hour, split where the interval crosses an hour. Three reads of
the inventory, one of the hour's rows, one upsert and a few UPDATEs to price
them: the statements do not grow with the fleet, only the rows read.

An hour is closed once it is over and the gateways have flushed its usage
(three of their flush intervals later): its tokens read from KeyUsage a last
time, its cost priced, ``closed`` set. Tokens are per model and hour, so they go
on one row of the model's in that hour, the GPU class it held most; adapters'
tokens are their base model's.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from fleet.conf import fleet_settings
from fleet.models import (
    GPU,
    SHARD_FINISHED,
    Adapter,
    CostHour,
    DesiredState,
    FleetStatus,
    KeyUsage,
    Model,
    Node,
    NodeState,
    Shard,
    ShardState,
)

from . import prices
from .attribution import Owner, attribute
from .budgets import OPEN, spend

logger = logging.getLogger(__name__)

HOUR = timedelta(hours=1)
# The upsert's key: CostHour's unique constraint.
_UNIQUE = ["hour", "idle", "gpu_class", "model_name", "team_name"]


@dataclass
class Accrued:
    """What one count did."""

    seconds: float = 0.0  # counted, all hours together
    left_out_s: float = 0.0  # a gap past LLMGW_COST_GAP_MAX_S, not counted
    hours: list[datetime] = field(default_factory=list)  # written
    closed: list[datetime] = field(default_factory=list)
    skipped: bool = False  # another count ran at the same time


def hour_of(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def pieces(start: datetime, end: datetime) -> list[tuple[datetime, float]]:
    """[start, end) cut at each hour: (the hour's start, seconds in it)."""
    out = []
    at = start
    while at < end:
        hour = hour_of(at)
        stop = min(end, hour + HOUR)
        out.append((hour, (stop - at).total_seconds()))
        at = stop
    return out


@dataclass
class Facts:
    nodes: list  # of NodeFact's shape
    gpus: list  # of GpuFact's shape
    holders: list  # of Holder's shape
    # (model name, team name) -> (model id, team id), for the rows' links
    ids: dict[tuple[str, str], tuple[int | None, int | None]]


def read_facts() -> Facts:
    """The inventory and what holds it now: three queries, no model instances.

    The ORM writes the SQL and the rows are fetched raw: its per-row conversion
    (a JSON list per shard) cost more than the rest of a count at 5,000 nodes.
    """
    # Rows as they come, in the shapes of NodeFact and GpuFact (attribute reads by position).
    nodes = _raw(Node.objects.exclude(state=NodeState.LOST).values_list("id", "memory_total_mb"))
    gpus = _raw(GPU.objects.order_by().values_list("node_id", "uuid", "name", "memory_total_mb"))
    # What holds its GPUs until its process is gone, as placement counts it
    # (fleet.services.snapshot): one stopped before it ever started holds nothing.
    held = Shard.objects.filter(node__isnull=False).exclude(state__in=SHARD_FINISHED)
    held = held.exclude(desired_state=DesiredState.STOPPED, state=ShardState.PENDING)
    holders, ids = [], {}
    for nid, uuids, state, want, model_id, model, team_id, team, share, host in _raw(
        held.order_by().values_list(
            "node_id",
            "gpu_uuids",
            "state",
            "desired_state",
            "replica__model_id",
            "replica__model__name",
            "replica__model__team_id",
            "replica__model__team__name",
            "replica__profile__gpu_memory_gb",
            "replica__profile__min_memory_gb",
        )
    ):
        team = team or ""
        if isinstance(uuids, str):  # SQLite's JSON is text; PostgreSQL's driver decodes it
            uuids = json.loads(uuids)
        asleep = state == ShardState.ASLEEP and want == DesiredState.ASLEEP
        # A Holder's shape, as a plain tuple: made 25,000 times at 5,000 nodes.
        holders.append((nid, uuids or (), model, team, share or None, host or None, asleep))
        ids[(model, team)] = (model_id, team_id)
    return Facts(nodes, gpus, holders, ids)


def _raw(queryset) -> list[tuple]:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def accrue(now: datetime | None = None) -> Accrued:
    """Count the time since the last count into the hours' rows, close the hours that are
    over, and bring the teams' spending up to date (fleet.services.costs.budgets)."""
    now = now or timezone.now()
    c = fleet_settings()
    facts = read_facts()
    done = Accrued()
    with transaction.atomic():
        last = FleetStatus.get().cost_accrued_at
        if last is not None and now <= last:
            # Counted up to a later time already (a worker whose clock is behind): the
            # count is never moved back, or that time would be counted twice.
            done.skipped = True
            return done
        # The guard: of two counts at once, one writes; the other counts nothing.
        if not FleetStatus.objects.filter(pk=1, cost_accrued_at=last).update(cost_accrued_at=now):
            done.skipped = True
            return done
        if last is not None:
            start = max(last, now - timedelta(seconds=c.cost_gap_max_s))
            if start > last:
                done.left_out_s = (start - last).total_seconds()
                logger.warning(
                    "costs: %.0f s since the last count, more than LLMGW_COST_GAP_MAX_S; "
                    "counting the last %.0f s only",
                    (now - last).total_seconds(),
                    c.cost_gap_max_s,
                )
            held = attribute(facts.nodes, facts.gpus, facts.holders)
            for hour, seconds in pieces(start, now):
                write_hour(hour, held, seconds, facts.ids)
                done.hours.append(hour)
                done.seconds += seconds
        price_list = prices.facts()
        if done.hours:
            prices.reprice(done.hours[0], prices=price_list)
        done.closed = close(now, price_list)
    spend(now)
    return done


def write_hour(
    hour: datetime,
    held: dict[Owner, float],
    seconds: float,
    ids: dict[tuple[str, str], tuple[int | None, int | None]],
) -> int:
    """Add ``held`` × ``seconds`` to the hour's rows and set its tokens: one read, one
    upsert of the rows that changed. Returns how many were written."""
    rows: dict[Owner, list] = {}  # owner -> [gpu_seconds, tokens, changed]
    for idle, gpu, model, team, secs, tokens, model_id, team_id in (
        CostHour.objects.filter(hour=hour)
        .order_by()
        .values_list(
            "idle",
            "gpu_class",
            "model_name",
            "team_name",
            "gpu_seconds",
            "tokens",
            "model_id",
            "team_id",
        )
    ):
        rows[Owner(idle, gpu, model, team)] = [secs, tokens, False]
        ids.setdefault((model, team), (model_id, team_id))
    for owner, amount in held.items():
        got = rows.setdefault(owner, [0.0, 0, True])
        if amount and seconds:
            got[0] += amount * seconds
            got[2] = True
    for owner, tokens in _tokens_on_rows(hour, rows, ids).items():
        got = rows.setdefault(owner, [0.0, 0, True])
        if got[1] != tokens:
            got[1] = tokens
            got[2] = True
    changed = []
    for owner, (secs, tokens, dirty) in rows.items():
        if not dirty:
            continue
        model_id, team_id = ids.get((owner.model, owner.team), (None, None))
        changed.append(
            CostHour(
                hour=hour,
                idle=owner.idle,
                gpu_class=owner.gpu_class,
                model_name=owner.model,
                team_name=owner.team,
                model_id=model_id,
                team_id=team_id,
                gpu_seconds=secs,
                tokens=tokens,
            )
        )
    if changed:
        CostHour.objects.bulk_create(
            changed,
            update_conflicts=True,
            unique_fields=_UNIQUE,
            update_fields=["gpu_seconds", "tokens", "model", "team"],
        )
    return len(changed)


def _tokens_on_rows(hour, rows: dict[Owner, list], ids: dict) -> dict[Owner, int]:
    """Each row's tokens: a model's for the hour on its row of the most GPU-seconds, 0 on
    its others; a model that served without a row (before its first count) gets one
    of its own, with no GPU-seconds and its team as it is now."""
    used: dict[str, int] = defaultdict(int)
    for name, p, c in (
        KeyUsage.objects.filter(hour=hour)
        .order_by()
        .values("model")
        .annotate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
        .values_list("model", "p", "c")
    ):
        used[name] += (p or 0) + (c or 0)
    base = dict(Adapter.objects.filter(name__in=list(used)).values_list("name", "model__name"))
    tokens: dict[str, int] = defaultdict(int)
    for name, n in used.items():
        tokens[base.get(name, name)] += n
    best: dict[str, Owner] = {}
    out: dict[Owner, int] = {}
    for owner, (secs, *_rest) in rows.items():
        if owner.idle:
            continue
        out[owner] = 0
        top = best.get(owner.model)
        if top is None or (secs, owner) > (rows[top][0], top):
            best[owner.model] = owner
    missing = [m for m in tokens if m not in best]
    if missing:
        for name, model_id, team_id, team in Model.objects.filter(name__in=missing).values_list(
            "name", "id", "team_id", "team__name"
        ):
            ids[(name, team or "")] = (model_id, team_id)
            best[name] = Owner(False, "", name, team or "")
        for name in missing:
            best.setdefault(name, Owner(False, "", name, ""))
    for model, n in tokens.items():
        out[best[model]] = n
    return out


def close(now: datetime, price_list=None) -> list[datetime]:
    """Close every hour that is over and whose usage the gateways have flushed."""
    flushed = 3 * fleet_settings().gateway_usage_flush_s
    before = now - HOUR - timedelta(seconds=flushed)
    hours = sorted(
        set(
            CostHour.objects.filter(closed__in=OPEN, hour__lte=before)
            .order_by()
            .values_list("hour", flat=True)
            .distinct()
        )
    )
    if not hours:
        return []
    price_list = prices.facts() if price_list is None else price_list
    for hour in hours:
        write_hour(hour, {}, 0.0, {})  # its tokens a last time
        prices.reprice(hour, hour + HOUR, prices=price_list)
        CostHour.objects.filter(hour=hour).update(closed=True)
        logger.info("costs: hour %s closed", hour.isoformat())
    return hours
