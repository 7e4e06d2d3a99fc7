"""The heartbeat write on PostgreSQL: what every heartbeat carries, in one statement.

A batch of heartbeats always says the same few things: these nodes were seen
now (and have applied desired version so-and-so), their disks, their load,
often their GPUs' memory. The portable ORM path (``orm.apply_common``) spends
about nine round trips and a model instance per row on that; on a busy machine
every round trip waits for the database process to get a CPU. Here it is one
statement of data-modifying CTEs fed with arrays, so a batch costs one round
trip however many heartbeats it holds. What heartbeats say only now and then
(new GPU problems, weights, engines, memory) is left to the portable code in
``apply``.

Semantics are the portable path's, fact by fact; tests/consumer/test_heartbeat_writes.py
runs both paths on the same heartbeats and compares the rows they leave.
"""

from datetime import datetime

from django.db import connection, transaction

from agentd import protocol
from fleet.models import NodeState

from .columns import NODE_LOAD, SHARD_LOAD


def _names(cols) -> str:
    return ", ".join(name for name, _ in cols)


def _arrays(prefix: str, cols) -> str:
    return ", ".join(f"%({prefix}_{name})s::{kind}[]" for name, kind in cols)


def _excluded(cols) -> str:
    return ", ".join(f"{name} = EXCLUDED.{name}" for name, _ in cols)


# The sub-statements of one statement all see the rows as they were when it
# started, and run in no defined order. So: the node's old state is read from
# that snapshot (for "node back" logging), storage rows are deleted and
# inserted freely (the delete cannot see the new rows), and shard loads are
# upserted while only the shards a node no longer reports are deleted, so the
# two never touch the same row.
#
# ``old`` holds only the nodes whose socket's credential is live and names
# them, and every write below is limited to its nodes: a revoked credential's
# heartbeat, or a removed node's, writes nothing (not even "seen"). Each node
# comes with one credential (``_rounds``), so ``old`` has a node at most once.
# A heartbeat's desired version (0: says nothing) moves the acknowledged one,
# never past the node's desired version. The node rows are locked in id order
# (``old``), as every other write to many nodes takes them (``desired.locked_nodes``):
# taken in the update's own order, a batch deadlocked with the reconciler's.
_ACK_MOVES = "seen.dv > 0 AND seen.dv <> n.acked_version"
_NEW_ACKED = "LEAST(seen.dv, n.desired_version)"

_SQL = f"""
WITH seen AS (
    SELECT * FROM unnest(%(ids)s::text[], %(cids)s::bigint[], %(dvs)s::bigint[])
        AS u(id, cred, dv)
),
old AS (
    SELECT n.id, n.state, n.desired_version, seen.cred
    FROM fleet_node n
    JOIN seen ON seen.id = n.id
    JOIN fleet_nodecredential c
        ON c.id = seen.cred AND c.node_id = n.id AND c.revoked_at IS NULL
    ORDER BY n.id
    FOR UPDATE OF n
),
touched AS (
    UPDATE fleet_node n
    SET last_seen = %(now)s, state = %(ready)s, connected = true,
        acked_version = CASE WHEN {_ACK_MOVES} THEN {_NEW_ACKED} ELSE n.acked_version END,
        -- fleet.services.desired.lag_since_after, on the row as it was.
        desired_lag_since = CASE
            WHEN NOT ({_ACK_MOVES}) THEN n.desired_lag_since
            WHEN {_NEW_ACKED} >= n.desired_version THEN NULL
            WHEN {_NEW_ACKED} > n.acked_version OR n.desired_lag_since IS NULL THEN %(now)s
            ELSE n.desired_lag_since END
    FROM seen WHERE n.id = seen.id AND n.id IN (SELECT id FROM old)
),
gpu_pos AS (
    SELECT id, node_id, memory_used_mb,
           row_number() OVER (PARTITION BY node_id ORDER BY index) - 1 AS pos
    FROM fleet_gpu
    WHERE node_id = ANY(%(gp_nodes)s::text[]) AND node_id IN (SELECT id FROM old)
),
gpu_used AS (
    UPDATE fleet_gpu g SET memory_used_mb = u.used
    FROM gpu_pos p
    JOIN unnest(%(gp_node)s::text[], %(gp_pos)s::integer[], %(gp_used)s::integer[])
        AS u(node_id, pos, used) ON u.node_id = p.node_id AND u.pos = p.pos
    WHERE g.id = p.id AND p.memory_used_mb <> u.used
),
storage_gone AS (
    DELETE FROM fleet_storage
    WHERE node_id = ANY(%(st_nodes)s::text[]) AND node_id IN (SELECT id FROM old)
),
storage_new AS (
    INSERT INTO fleet_storage (node_id, path, free_bytes, total_bytes, shared)
    SELECT * FROM unnest(
        %(st_node)s::text[], %(st_path)s::text[], %(st_free)s::bigint[],
        %(st_total)s::bigint[], %(st_shared)s::boolean[]
    ) AS u(node_id, path, free_bytes, total_bytes, shared)
    WHERE u.node_id IN (SELECT id FROM old)
),
load_new AS (
    INSERT INTO fleet_nodeload (node_id, sampled_at, {_names(NODE_LOAD)})
    SELECT * FROM unnest(
        %(ld_node)s::text[], %(ld_at)s::timestamptz[], {_arrays("ld", NODE_LOAD)}
    ) AS u(node_id, sampled_at, {_names(NODE_LOAD)})
    WHERE u.node_id IN (SELECT id FROM old)
    ON CONFLICT (node_id) DO UPDATE SET
        sampled_at = EXCLUDED.sampled_at, {_excluded(NODE_LOAD)}
),
shards_gone AS (
    DELETE FROM fleet_shardload s
    WHERE s.node_id = ANY(%(ld_node)s::text[])
      AND s.node_id IN (SELECT id FROM old)
      AND NOT EXISTS (
        SELECT 1 FROM unnest(%(sh_node)s::text[], %(sh_id)s::text[]) AS k(node_id, shard_id)
        WHERE k.node_id = s.node_id AND k.shard_id = s.shard_id
      )
),
shards_new AS (
    INSERT INTO fleet_shardload (node_id, shard_id, sampled_at, {_names(SHARD_LOAD)})
    SELECT * FROM unnest(
        %(sh_node)s::text[], %(sh_id)s::text[], %(sh_at)s::timestamptz[],
        {_arrays("sh", SHARD_LOAD)}
    ) AS u(node_id, shard_id, sampled_at, {_names(SHARD_LOAD)})
    WHERE u.node_id IN (SELECT id FROM old)
      -- Only shards this node holds: a load under a shard id of another node
      -- would be exported with the model of that shard.
      AND EXISTS (
        SELECT 1 FROM fleet_shard sh WHERE sh.id = u.shard_id AND sh.node_id = u.node_id
      )
    ON CONFLICT (node_id, shard_id) DO UPDATE SET
        sampled_at = EXCLUDED.sampled_at, {_excluded(SHARD_LOAD)}
    RETURNING node_id, shard_id
)
SELECT old.id, old.state, old.desired_version, old.cred,
       ARRAY(SELECT w.shard_id FROM shards_new w WHERE w.node_id = old.id)
FROM old
"""


def apply_common(
    batch: list[tuple[str, int, protocol.Heartbeat, datetime]], now: datetime
) -> tuple[dict[str, tuple[str, int]], set[tuple[str, int]], dict[str, list[str]]]:
    """Write what every heartbeat carries, for live credentials only. Returns ({node
    written: (old state, desired version)}, {(node, credential) still live}, {node:
    shard loads dropped as not its own}), as ``orm.apply_common`` does.
    """
    rounds = _rounds(batch)
    if len(rounds) == 1:
        return _apply_round(rounds[0], now)
    nodes: dict[str, tuple[str, int]] = {}
    live: set[tuple[str, int]] = set()
    foreign: dict[str, list[str]] = {}
    with transaction.atomic():
        for part in rounds:
            written, held, dropped = _apply_round(part, now)
            for node_id, old in written.items():
                nodes.setdefault(node_id, old)  # the state before the first write
            live |= held
            foreign.update(dropped)
    return nodes, live, foreign


def _rounds(batch: list) -> list[list]:
    """The batch split so that each part has one credential per node.

    A node's heartbeats nearly always come from one socket, so one part. Two
    sockets of one node in a batch (a reconnect, the old socket not yet closed)
    may hold different credentials, one of them revoked: each credential's
    heartbeats are then a statement of their own, checked on their own.
    """
    creds: dict[str, list[int]] = {}
    rounds: list[list] = []
    for item in batch:
        mine = creds.setdefault(item[0], [])
        if item[1] not in mine:
            mine.append(item[1])
        k = mine.index(item[1])
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(item)
    return rounds


def _apply_round(
    batch: list[tuple[str, int, protocol.Heartbeat, datetime]], now: datetime
) -> tuple[dict[str, tuple[str, int]], set[tuple[str, int]], dict[str, list[str]]]:
    # Later heartbeats of a node win, as they would applied one by one; an
    # unset desired version (0) says nothing and leaves the earlier one.
    dvs: dict[str, int] = {}
    cred_of = {node_id: cred for node_id, cred, _hb, _at in batch}  # one each: _rounds
    gpu_used: dict[str, dict[int, int]] = {}  # node -> {position in index order: MB}
    storage: dict[str, list] = {}
    loads: dict[str, tuple[protocol.Load, datetime]] = {}
    for node_id, _cred, hb, arrived in batch:
        if hb.desired_version or node_id not in dvs:
            dvs[node_id] = hb.desired_version
        if hb.gpu_memory_used_mb:
            gpu_used.setdefault(node_id, {}).update(enumerate(hb.gpu_memory_used_mb))
        if hb.storage:
            storage[node_id] = hb.storage
        if hb.load is not None:
            loads[node_id] = (hb.load, arrived)

    gp = [(n, pos, mb) for n, used in gpu_used.items() for pos, mb in used.items()]
    st = [(n, s) for n, lst in storage.items() for s in lst]
    shards = {(n, s.shard_id): (s, at) for n, (load, at) in loads.items() for s in load.shards}
    params = {
        "ids": list(dvs),
        "cids": [cred_of[n] for n in dvs],
        "dvs": list(dvs.values()),
        "now": now,
        "ready": NodeState.READY.value,
        "gp_nodes": list(gpu_used),
        "gp_node": [n for n, _, _ in gp],
        "gp_pos": [pos for _, pos, _ in gp],
        "gp_used": [mb for _, _, mb in gp],
        "st_nodes": list(storage),
        "st_node": [n for n, _ in st],
        "st_path": [s.path for _, s in st],
        "st_free": [s.free_bytes for _, s in st],
        "st_total": [s.total_bytes for _, s in st],
        "st_shared": [s.shared for _, s in st],
        "ld_node": list(loads),
        "ld_at": [at for _, at in loads.values()],
        **{f"ld_{name}": [getattr(ld, name) for ld, _ in loads.values()] for name, _ in NODE_LOAD},
        "sh_node": [n for n, _ in shards],
        "sh_id": [sid for _, sid in shards],
        "sh_at": [at for _, at in shards.values()],
        **{f"sh_{name}": [getattr(s, name) for s, _ in shards.values()] for name, _ in SHARD_LOAD},
    }
    nodes: dict[str, tuple[str, int]] = {}
    live: set[tuple[str, int]] = set()
    foreign: dict[str, list[str]] = {}
    with connection.cursor() as cur:
        cur.execute(_SQL, params)
        for node_id, state, desired, cred, stored in cur.fetchall():
            nodes[node_id] = (state, desired)
            live.add((node_id, cred))
            if node_id in loads:
                sent = [s.shard_id for s in loads[node_id][0].shards]
                dropped = [sid for sid in sent if sid not in stored]
                if dropped:
                    foreign[node_id] = dropped
    return nodes, live, foreign
