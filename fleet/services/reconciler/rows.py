"""What a reconciler pass reads, as plain rows: raw queries into slotted objects.

At 5,000 nodes and 2,000 replicas the ORM's per-row work (model instances,
datetime and JSON conversion) cost more than the pass's own logic, so the hot
reads are raw SELECTs here. Writes stay in the ORM. The row objects carry the
same attribute names as the models, so the pass treats both alike.
"""

import json
from datetime import UTC, datetime

from django.db import connection

from fleet.models import DesiredState, Node, Replica, ReplicaState, Shard


def _rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def dt(value) -> datetime | None:
    """A timestamp column as an aware datetime (SQLite hands back text)."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _json(value, empty):
    if value is None:
        return empty
    return json.loads(value) if isinstance(value, str) else value


class ReplicaRow:
    __slots__ = (
        "id",
        "model_id",
        "profile_id",
        "profile",
        "state",
        "reason",
        "state_changed_at",
        "failures",
        "restarts",
        "retry_at",
        "spec_hash",
        "node_failures",
        "created_at",
        "updated_at",
        "preempted_by",
        "preempted_for",
        "evict",
        "evict_at",
        "evict_by",
        "sleep_for",
    )

    def __init__(self, row, profiles):
        (
            self.id,
            self.model_id,
            self.profile_id,
            self.state,
            self.reason,
            changed,
            self.failures,
            self.restarts,
            retry,
            self.spec_hash,
            failures,
            created,
            updated,
            self.preempted_by,
            self.preempted_for,
            self.evict,
            evict_at,
            self.evict_by,
            self.sleep_for,
        ) = row
        self.evict_at = dt(evict_at)
        self.profile = profiles[self.profile_id]
        self.state_changed_at = dt(changed)
        self.retry_at = dt(retry)
        self.node_failures = _json(failures, {})
        self.created_at = dt(created)
        self.updated_at = dt(updated)

    @property
    def pk(self) -> str:
        return self.id


class ShardRow:
    __slots__ = (
        "id",
        "replica_id",
        "node_id",
        "rank",
        "desired_state",
        "state",
        "error",
        "exit_code",
        "state_changed_at",
        "fetch_updated_at",
        "created_at",
        "gpu_uuids",
    )

    def __init__(self, row):
        (
            self.id,
            self.replica_id,
            self.node_id,
            self.rank,
            self.desired_state,
            self.state,
            self.error,
            self.exit_code,
            changed,
            fetched,
            created,
            gpus,
        ) = row
        self.gpu_uuids = _json(gpus, [])
        self.state_changed_at = dt(changed)
        self.fetch_updated_at = dt(fetched)
        self.created_at = dt(created)

    @property
    def pk(self) -> str:
        return self.id


def live_replicas(profiles: dict) -> list[ReplicaRow]:
    """Every replica not stopped, oldest first."""
    table = Replica._meta.db_table
    return [
        ReplicaRow(row, profiles)
        for row in _rows(
            "SELECT id, model_id, profile_id, state, reason, state_changed_at, failures, "
            "restarts, retry_at, spec_hash, node_failures, created_at, updated_at, "
            "preempted_by, preempted_for, evict, evict_at, evict_by, sleep_for "
            f"FROM {table} WHERE state <> %s ORDER BY created_at, id",
            [ReplicaState.STOPPED],
        )
    ]


def active_shards() -> list[ShardRow]:
    """Every shard meant to run or drain, by rank."""
    table = Shard._meta.db_table
    return [
        ShardRow(row)
        for row in _rows(
            "SELECT id, replica_id, node_id, rank, desired_state, state, error, exit_code, "
            f"state_changed_at, fetch_updated_at, created_at, gpu_uuids FROM {table} "
            "WHERE desired_state <> %s ORDER BY rank",
            [DesiredState.STOPPED],
        )
    ]


def node_silence_rows() -> list[tuple[str, str, datetime]]:
    """(id, state, last_seen) of every node that has been heard from."""
    table = Node._meta.db_table
    return [
        (nid, state, dt(seen))
        for nid, state, seen in _rows(
            f"SELECT id, state, last_seen FROM {table} WHERE last_seen IS NOT NULL"
        )
    ]
