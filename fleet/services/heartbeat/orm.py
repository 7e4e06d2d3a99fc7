"""The heartbeat write in the ORM: what every heartbeat carries, on any database.

``pg.apply_common`` does the same on PostgreSQL in one statement; the two are
kept side by side and checked against each other by tests/consumer/test_heartbeat_writes.py.
"""

from datetime import datetime

from django.db.models import FilteredRelation, Q

from agentd import protocol
from fleet.models import Node, NodeLoad, NodeState, Shard, ShardLoad

from ..desired import lag_since_after
from . import changes
from .columns import NODE_LOAD


def apply_common(
    batch: list[tuple[str, int, protocol.Heartbeat, datetime]], now: datetime
) -> tuple[dict[str, tuple[str, int]], set[tuple[str, int]], dict[str, list[str]]]:
    """What every heartbeat carries, portably (``pg.apply_common`` is the same on
    PostgreSQL in one statement). Only a heartbeat whose credential is live and
    names its node is written. Returns ({node written: (old state, desired
    version)}, {(node, credential) still live}, {node: shard loads dropped as not
    its own}).
    """
    rows = (
        Node.objects.filter(pk__in={b[0] for b in batch})
        .annotate(
            live=FilteredRelation(
                "credentials",
                condition=Q(
                    credentials__pk__in={b[1] for b in batch},
                    credentials__revoked_at__isnull=True,
                ),
            )
        )
        .values_list("pk", "state", "desired_version", "acked_version", "live__pk")
    )
    live: set[tuple[str, int]] = set()
    nodes: dict[str, tuple[str, int]] = {}
    acked: dict[str, int] = {}
    for node_id, state, desired, acked_version, cred in rows:
        if cred is None:
            # No credential of this batch holds for the node (revoked, or not
            # its own): its heartbeats write nothing, not even "seen".
            continue
        live.add((node_id, cred))
        nodes[node_id] = (state, desired)
        acked[node_id] = acked_version
    if nodes:
        Node.objects.filter(pk__in=list(nodes)).update(
            last_seen=now, state=NodeState.READY, connected=True
        )
    storage: dict[str, list] = {}
    loads: dict[str, tuple[protocol.Load, datetime]] = {}
    reported: dict[str, int] = {}  # the last desired version each node gave, if any
    for node_id, cred, hb, arrived in batch:
        if (node_id, cred) not in live:
            continue
        # Disk is a fact about a moment, not a machine: replaced every time.
        if hb.storage:
            storage[node_id] = hb.storage
        if hb.load is not None:
            loads[node_id] = (hb.load, arrived)
        if hb.desired_version:
            reported[node_id] = hb.desired_version
    for node_id, version in reported.items():
        # The node's last word in the batch against the row as it was, as the
        # PostgreSQL statement sees it; lag_since_after keeps the lag.
        if version != acked[node_id]:
            new = min(version, nodes[node_id][1])
            Node.objects.filter(pk=node_id).update(
                acked_version=new, desired_lag_since=lag_since_after(new, now)
            )
    if storage:
        changes.replace_storage(list(storage.items()))
    foreign: dict[str, list[str]] = {}
    if loads:
        foreign = store_loads(loads)
    return nodes, live, foreign


def store_loads(loads: dict[str, tuple[protocol.Load, datetime]]) -> dict[str, list[str]]:
    """Replace the nodes' loads. A shard load counts only for a shard the node holds
    (one under another node's shard would be exported with that shard's model);
    returns the dropped ones, {node: [shard id]}."""
    held = set(
        Shard.objects.filter(
            node_id__in=list(loads),
            pk__in={s.shard_id for load, _ in loads.values() for s in load.shards},
        ).values_list("node_id", "pk")
    )
    foreign: dict[str, list[str]] = {}
    for node_id, (load, _) in loads.items():
        for s in load.shards:
            if (node_id, s.shard_id) not in held:
                foreign.setdefault(node_id, []).append(s.shard_id)
    NodeLoad.objects.bulk_create(
        [
            NodeLoad(
                node_id=node_id,
                sampled_at=at,
                **load.model_dump(exclude={"shards"}),
            )
            for node_id, (load, at) in loads.items()
        ],
        update_conflicts=True,
        unique_fields=["node"],
        update_fields=["sampled_at", *(name for name, _ in NODE_LOAD)],
    )
    ShardLoad.objects.filter(node_id__in=list(loads)).delete()
    ShardLoad.objects.bulk_create(
        ShardLoad(node_id=node_id, sampled_at=at, **s.model_dump())
        for node_id, (load, at) in loads.items()
        for s in load.shards
        if (node_id, s.shard_id) in held
    )
    return foreign
