"""What the clean-up's rules need, read from the database in a few raw queries.

Raw rows, not model instances: 5,000 nodes × 20 entries must be read and
judged well under a second (bench/weights_gc.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection

from fleet.conf import fleet_settings
from fleet.models import SHARD_FINISHED, DesiredState, LocalWeights, Model, Node, Shard, Storage
from fleet.services.weight_names import Wanted

from .rules import Entry, Filesystem, Policy


def _rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def ts(value) -> float | None:
    """A timestamp column as unix seconds (SQLite gives text, PostgreSQL datetimes)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


@dataclass
class Facts:
    entries: list[Entry]
    needed: dict[str, Wanted]
    filesystems: list[Filesystem]
    connected: set[str]
    policy: Policy
    desired_versions: dict[str, int]


def policy() -> Policy:
    s = fleet_settings()
    overrides = tuple(
        (path, float(seconds))
        for path, seconds in Model.objects.filter(weights_retention_s__isnull=False).values_list(
            "profiles__model_path", "weights_retention_s"
        )
        if path
    )
    return Policy(
        retention_s=s.weights_retention_s,
        high_percent=s.weights_high_watermark_percent,
        low_percent=s.weights_low_watermark_percent,
        overrides=overrides,
    )


def needed_by_node() -> dict[str, Wanted]:
    """Each node's model paths that a desired or running shard there needs.

    A shard is let go only when it is both desired stopped and finished: one
    placed a moment ago (pending, not yet heard of by its agent) counts.
    """
    t = Shard._meta.db_table
    finished = ", ".join(f"'{s}'" for s in SHARD_FINISHED)
    needed: dict[str, Wanted] = {}
    paths: dict[object, str] = {}  # a spec's text -> its model_path, decoded once
    for nid, spec in _rows(
        f"SELECT node_id, spec FROM {t} WHERE node_id IS NOT NULL "
        f"AND NOT (desired_state = %s AND state IN ({finished}))",
        [DesiredState.STOPPED],
    ):
        key = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True)
        path = paths.get(key)
        if path is None:
            decoded = json.loads(spec) if isinstance(spec, str) else (spec or {})
            path = paths[key] = ((decoded or {}).get("profile") or {}).get("model_path") or ""
        if path:
            needed.setdefault(nid, Wanted()).add(path)
    return needed


def _epoch(column: str) -> str:
    """SQL for a timestamp column as unix seconds: no per-row datetime in Python."""
    if connection.vendor == "postgresql":
        return f"EXTRACT(EPOCH FROM {column})::float8"
    return f"(julianday({column}) - 2440587.5) * 86400.0"  # stored as UTC text


def weights_query(now: float) -> tuple[str, list]:
    """The one query over every weights row, in ``Entry``'s order of fields."""
    s = fleet_settings()
    adapt = connection.ops.adapt_datetimefield_value
    removal_until = adapt(datetime.fromtimestamp(now - s.weights_removal_timeout_s, tz=UTC))
    kept_until = adapt(datetime.fromtimestamp(now - s.weights_kept_retry_s, tz=UTC))
    # Busy: a removal under way (not yet overdue), or kept by the node a short while ago.
    busy = (
        "CASE WHEN (removal <> '' AND removal_at > %s) "
        "OR (kept_at > %s AND NOT remove_requested) THEN 1 ELSE 0 END"
    )
    sql = (
        f"SELECT id, node_id, path, size_bytes, source, shared, pinned, "
        f"{_epoch('last_used_at')}, {_epoch('unused_since')}, remove_requested, {busy} "
        f"FROM {LocalWeights._meta.db_table}"
    )
    return sql, [removal_until, kept_until]


def load(now: float) -> Facts:
    rows = _rows(*weights_query(now))
    entries = list(map(Entry._make, rows))
    filesystems = [
        Filesystem(nid, path, free, total, bool(shared))
        for nid, path, free, total, shared in _rows(
            f"SELECT node_id, path, free_bytes, total_bytes, shared FROM {Storage._meta.db_table}"
        )
    ]
    versions: dict[str, int] = {}
    connected: set[str] = set()
    for nid, is_connected, version in _rows(
        f"SELECT id, connected, desired_version FROM {Node._meta.db_table}"
    ):
        versions[nid] = version
        if is_connected:
            connected.add(nid)
    return Facts(entries, needed_by_node(), filesystems, connected, policy(), versions)
