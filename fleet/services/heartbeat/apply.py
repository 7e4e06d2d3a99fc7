"""Applying heartbeats: the memo that keeps unchanged facts out, and a batch's writes.

A heartbeat's facts, each with the seed's meaning (docs/protocol.md): what
every heartbeat carries (seen now, acked version, storage, load, GPU memory) is
written by ``pg.apply_common`` on PostgreSQL or ``orm.apply_common`` elsewhere;
what it says only now and then (new GPU problems, weights, memory, engines,
installs) is written here, by ``_apply_rare``.
"""

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from agentd import protocol
from fleet.models import GPU, Node, NodeState

from .. import doorbells, gpu_health, history
from ..reconciler.ask import request_reconcile
from . import changes, orm, pg

logger = logging.getLogger(__name__)

# A GPU whose memory in use falls by this much (MiB) between two heartbeats has room
# a reconciler pass may give out at once (``ReportMemo.freed``).
FREED_MB = 1024


class ReportMemo:
    """What one agent socket last had written, so an unchanged fact is not written again.

    Most heartbeats repeat the GPU memory and disk figures of the one before; a
    fact equal to what was written is sent to the writer as no news, which the
    protocol already defines as "leave it as it is". Reset on every register,
    since a register rewrites those rows.
    """

    def __init__(self) -> None:
        self.gpu_used: list[int] | None = None
        self.storage: list | None = None

    def news(self, hb: protocol.Heartbeat) -> protocol.Heartbeat:
        update = {}
        if hb.gpu_memory_used_mb and hb.gpu_memory_used_mb == self.gpu_used:
            update["gpu_memory_used_mb"] = []
        if hb.storage and hb.storage == self.storage:
            update["storage"] = []
        return hb.model_copy(update=update) if update else hb

    def freed(self, hb: protocol.Heartbeat) -> bool:
        """Whether a GPU's memory in use fell by ``FREED_MB`` or more since the last
        heartbeat written: an engine gave its memory back (asleep, stopped), and a
        replica waiting to wake or be placed there need not wait for the next pass."""
        if not hb.gpu_memory_used_mb or self.gpu_used is None:
            return False
        return any(
            before - now >= FREED_MB
            for before, now in zip(self.gpu_used, hb.gpu_memory_used_mb, strict=False)
        )

    def written(self, hb: protocol.Heartbeat) -> None:
        if hb.gpu_memory_used_mb:
            self.gpu_used = list(hb.gpu_memory_used_mb)
        if hb.storage:
            self.storage = list(hb.storage)


@dataclass
class HeartbeatResult:
    desired_version: int
    revoked: bool
    # Shard loads dropped because the node does not hold those shards.
    foreign_shards: tuple[str, ...] = ()


def _says_something_rare(hb: protocol.Heartbeat, *, gpu_memory_too: bool) -> bool:
    """Facts a heartbeat carries only now and then, left to _apply_rare."""
    return bool(
        (gpu_memory_too and hb.gpu_memory_used_mb)
        or hb.new_problems
        or hb.weights_changed
        or hb.memory_total_mb is not None
        or hb.engines_changed
        or hb.provision_changed
    )


def apply_heartbeats(
    batch: list[tuple[str, int, protocol.Heartbeat, datetime]],
) -> dict[tuple[str, int], HeartbeatResult]:
    """Apply many nodes' heartbeats in one transaction, a few queries in all.

    ``batch`` holds (node id, credential id, heartbeat, arrival time). One node
    may appear more than once; its heartbeats are applied in order. A heartbeat
    whose credential has been revoked (or whose node was removed) since its
    socket connected writes nothing at all. Returns, per (node, credential)
    (two sockets of one node may hold different ones), the desired-set version
    the node should have and whether the credential has been revoked.
    """
    if not batch:
        return {}
    now = timezone.now()
    write = _common_writer()
    on_pg = write is pg.apply_common
    # The PostgreSQL statement writes GPU memory too; the portable path leaves it here.
    gpu_memory_too = not on_pg
    rare = [b for b in batch if _says_something_rare(b[2], gpu_memory_too=gpu_memory_too)]
    if on_pg and not rare:
        # One statement is atomic by itself: no BEGIN and COMMIT round trips.
        nodes, live, foreign = write(batch, now)
    else:
        with transaction.atomic():
            nodes, live, foreign = write(batch, now)
            if rare:
                _apply_rare(
                    [b for b in rare if (b[0], b[1]) in live], gpu_memory_too=gpu_memory_too
                )
    # After the commit, and outside it: the charts' history is a convenience,
    # and Redis being slow or away must cost a heartbeat nothing but its point.
    history.record_loads(
        (node_id, hb.load, arrived)
        for node_id, cred, hb, arrived in batch
        if hb.load is not None and (node_id, cred) in live
    )
    back = [node_id for node_id, (state, _) in nodes.items() if state != NodeState.READY]
    for node_id in back:
        logger.info("node back node=%s was=%s", node_id, nodes[node_id][0])
        request_reconcile()
    if back:
        # Its replicas were the gateways' last resort while it was suspect.
        doorbells.ring_gateways("routes")
    return {
        (node_id, cred): HeartbeatResult(
            desired_version=nodes[node_id][1] if node_id in nodes else 0,
            revoked=(node_id, cred) not in live,
            foreign_shards=tuple(foreign.get(node_id, ())) if (node_id, cred) in live else (),
        )
        for node_id, cred, _hb, _at in batch
    }


def _common_writer():
    return pg.apply_common if connection.vendor == "postgresql" else orm.apply_common


def _apply_rare(
    batch: list[tuple[str, int, protocol.Heartbeat, datetime]], *, gpu_memory_too: bool
) -> None:
    """New GPU problems, weights, memory, engines (and GPU memory where the common write
    does not do it): what heartbeats say now and then."""
    node_ids = {b[0] for b in batch}
    nodes = {
        n.pk: n
        for n in Node.objects.filter(pk__in=node_ids).only(
            "id", "memory_total_mb", "engine_versions"
        )
    }
    gpus_needed = {
        b[0] for b in batch if (gpu_memory_too and b[2].gpu_memory_used_mb) or b[2].new_problems
    }
    gpus: dict[str, list[GPU]] = {}
    if gpus_needed:
        for g in GPU.objects.filter(node_id__in=gpus_needed).order_by("index"):
            gpus.setdefault(g.node_id, []).append(g)
    dirty_gpus: dict[int, GPU] = {}
    # Nodes whose GPUs' problems or installs this batch changes: the rows
    # no longer are what their last registration wrote (inventory.register_node).
    changed_inventory: set[str] = set()
    for node_id, _cred, hb, _arrived in batch:
        node = nodes.get(node_id)
        if node is None:
            continue
        node_gpus = gpus.get(node_id, [])
        for gpu, used in zip(
            node_gpus, hb.gpu_memory_used_mb if gpu_memory_too else (), strict=False
        ):
            if gpu.memory_used_mb != used:
                gpu.memory_used_mb = used
                dirty_gpus[gpu.pk] = gpu
        for p in hb.new_problems:
            # Charged to the named GPU, else the first: any problem keeps a
            # GPU out of placement, which is the conservative direction.
            target = next((g for g in node_gpus if g.index == p.gpu_index), None)
            target = target or (node_gpus[0] if node_gpus else None)
            if target is not None and p.problem not in target.problems:
                target.problems = [*target.problems, p.problem]
                gpu_health.refresh(target, timezone.now())
                dirty_gpus[target.pk] = target
                changed_inventory.add(node_id)
                logger.warning(
                    "gpu problem node=%s gpu=%d problem=%s", node_id, target.index, p.problem
                )
        # Only when flagged: an empty list without the flag is silence.
        if hb.weights_changed:
            changes.replace_weights(node, hb.weights)
        if hb.memory_total_mb is not None and changes.memory_changed(
            node_id, node.memory_total_mb, hb.memory_total_mb
        ):
            node.memory_total_mb = hb.memory_total_mb
            Node.objects.filter(pk=node_id).update(memory_total_mb=hb.memory_total_mb)
        if hb.engines_changed and changes.engines_changed(
            node_id, node.engine_versions, hb.engine_versions
        ):
            node.engine_versions = hb.engine_versions
            Node.objects.filter(pk=node_id).update(engine_versions=hb.engine_versions)
        if hb.provision_changed:
            changes.replace_installs(node, hb.provision)
            changed_inventory.add(node_id)
    if changed_inventory:
        Node.objects.filter(pk__in=changed_inventory).update(inventory_digest="")
    if dirty_gpus:
        GPU.objects.bulk_update(
            dirty_gpus.values(), ["memory_used_mb", "problems", "health", "health_reason"]
        )
