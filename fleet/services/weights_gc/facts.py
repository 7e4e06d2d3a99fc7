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


def load(now: float) -> Facts:
    s = fleet_settings()
    removal_until = now - s.weights_removal_timeout_s
    kept_until = now - s.weights_kept_retry_s
    entries = []
    for (
        pk,
        nid,
        path,
        size,
        source,
        shared,
        pinned,
        last_used,
        unused_since,
        requested,
        removal,
        removal_at,
        kept_at,
    ) in _rows(
        "SELECT id, node_id, path, size_bytes, source, shared, pinned, last_used_at, "
        "unused_since, remove_requested, removal, removal_at, kept_at "
        f"FROM {LocalWeights._meta.db_table}"
    ):
        busy = False
        if removal:
            at = ts(removal_at)
            busy = at is not None and at > removal_until
        if not busy and kept_at is not None:
            busy = ts(kept_at) > kept_until and not requested
        entries.append(
            Entry(
                id=pk,
                node_id=nid,
                path=path,
                size_bytes=size,
                source=source or "",
                shared=bool(shared),
                pinned=bool(pinned),
                last_used=ts(last_used),
                unused_since=ts(unused_since),
                remove_requested=bool(requested),
                busy=busy,
            )
        )
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
