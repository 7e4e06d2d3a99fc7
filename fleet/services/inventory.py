"""Folding what agents report into the inventory."""

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.db.models import FilteredRelation, Q
from django.utils import timezone

from agentd import protocol
from fleet.gateway import notify as gateway_notify
from fleet.models import (
    GPU,
    EngineInstall,
    FabricAttachment,
    LocalWeights,
    Node,
    NodeLoad,
    NodeState,
    Shard,
    ShardLoad,
    ShardState,
    Storage,
)

from . import heartbeat_pg, reconcile_lock

logger = logging.getLogger(__name__)

_FAILED_INSTALL = {"failed", "unsupported"}


def _log_install_changes(node_id: str, before: dict, installs: list) -> None:
    # A state change is worth a line; a download's progress is not.
    for e in installs:
        if before.get(e.engine) != e.state:
            level = logging.WARNING if e.state in _FAILED_INSTALL else logging.INFO
            logger.log(
                level,
                "engine installation node=%s engine=%s version=%s variant=%s state=%s detail=%s",
                node_id,
                e.engine,
                e.version,
                e.variant,
                e.state,
                e.detail,
            )


def _replace_installs(node: Node, installs: list) -> None:
    before = dict(node.engine_installs.values_list("engine", "state"))
    _log_install_changes(node.pk, before, installs)
    node.engine_installs.all().delete()
    EngineInstall.objects.bulk_create(EngineInstall(node=node, **e.model_dump()) for e in installs)


def _replace_storage(node_ids_and_lists) -> None:
    node_ids = [n for n, _ in node_ids_and_lists]
    Storage.objects.filter(node_id__in=node_ids).delete()
    Storage.objects.bulk_create(
        Storage(node_id=n, **s.model_dump()) for n, lst in node_ids_and_lists for s in lst
    )


def _replace_weights(node: Node, weights: list) -> None:
    node.weights.all().delete()
    LocalWeights.objects.bulk_create(LocalWeights(node=node, **w.model_dump()) for w in weights)


def register_node(reg: protocol.Register, *, channel_name: str = "") -> Node:
    """Take a registration: the node's whole inventory is replaced by what it reports.

    Operator intent (cordon, drain, operator labels) is never touched.
    """
    now = timezone.now()
    with transaction.atomic():
        node, created = Node.objects.select_for_update().get_or_create(pk=reg.node_id)
        was = node.state
        if not created and node.memory_total_mb != reg.memory_total_mb:
            logger.info(
                "node memory changed node=%s from_mb=%s to_mb=%s",
                node.pk,
                node.memory_total_mb,
                reg.memory_total_mb,
            )
        if not created and node.engine_versions != reg.engine_versions:
            logger.info(
                "node engines changed node=%s from=%s to=%s",
                node.pk,
                sorted(node.engine_versions),
                sorted(reg.engine_versions),
            )
        node.hostname = reg.hostname
        node.mgmt_addr = reg.mgmt_addr
        node.agent_labels = reg.labels
        node.agent_version = reg.agent_version
        node.engine_versions = reg.engine_versions
        node.memory_total_mb = reg.memory_total_mb
        node.running_shards = [s.model_dump() for s in reg.running_shards]
        if reg.desired_version > node.desired_version:
            # The agent has seen newer versions than this database knows: it was
            # restored from a backup, or rebuilt. The agent ignores versions older
            # than its newest (fencing), so continue numbering above its count.
            logger.warning(
                "node reports a newer desired version than the database node=%s reported=%d "
                "known=%d; continuing from the node's",
                node.pk,
                reg.desired_version,
                node.desired_version,
            )
            node.desired_version = reg.desired_version + 1
        node.acked_version = min(reg.desired_version, node.desired_version)
        node.state = NodeState.READY
        node.connected = True
        node.last_seen = now
        node.registered_at = now
        if channel_name:
            node.channel_name = channel_name
        node.save()

        GPU.objects.filter(node=node).delete()
        GPU.objects.bulk_create(GPU(node=node, **g.model_dump()) for g in reg.gpus)
        node.fabrics.all().delete()
        FabricAttachment.objects.bulk_create(
            FabricAttachment(node=node, **f.model_dump()) for f in reg.fabrics
        )
        _replace_storage([(node.pk, reg.storage)])
        _replace_weights(node, reg.weights)
        _replace_installs(node, reg.provision)
        _apply_running_shards(node, reg.running_shards, now)
    if was != NodeState.READY and not created:
        logger.info("node back node=%s was=%s", node.pk, was)
    logger.info(
        "agent registered node=%s gpus=%d fabrics=%s running_shards=%d agent_version=%s",
        node.pk,
        len(reg.gpus),
        [f.fabric for f in reg.fabrics],
        len(reg.running_shards),
        reg.agent_version,
    )
    return node


def _apply_running_shards(node: Node, running, now: datetime) -> None:
    """What the agent runs is the truth about the shards it holds for this node."""
    by_id = {s.shard_id: s for s in running}
    for shard in Shard.objects.filter(node=node, pk__in=list(by_id)):
        state = protocol.shard_state_from_wire(by_id[shard.pk].state)
        if shard.state != state:
            shard.state = state
            shard.state_changed_at = now
            shard.save(update_fields=["state", "state_changed_at"])
            transaction.on_commit(lambda: gateway_notify.changed("routes"))


def mark_disconnected(node_id: str, channel_name: str) -> bool:
    """The socket closed. The node is not lost: losing a stream is not losing a node.

    Only the socket that holds the node may say so: an old socket closing after
    a reconnect must not mark the new one disconnected.
    """
    return bool(
        Node.objects.filter(pk=node_id, channel_name=channel_name).update(
            connected=False, channel_name=""
        )
    )


@dataclass
class HeartbeatResult:
    desired_version: int
    revoked: bool


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
) -> dict[str, HeartbeatResult]:
    """Apply many nodes' heartbeats in one transaction, a few queries in all.

    ``batch`` holds (node id, credential id, heartbeat, arrival time). One node
    may appear more than once; its heartbeats are applied in order. Returns, per
    node, the desired-set version it should have and whether its credential has
    been revoked (or its node removed) since it connected.
    """
    if not batch:
        return {}
    now = timezone.now()
    write = _common_writer()
    gpu_memory_too = write is not heartbeat_pg.apply_common
    rare = [b for b in batch if _says_something_rare(b[2], gpu_memory_too=gpu_memory_too)]
    if write is heartbeat_pg.apply_common and not rare:
        # One statement is atomic by itself: no BEGIN and COMMIT round trips.
        nodes, live = write(batch, now)
    else:
        with transaction.atomic():
            nodes, live = write(batch, now)
            if rare:
                _apply_rare([b for b in rare if b[0] in nodes], gpu_memory_too=gpu_memory_too)
    for node_id, (state, _) in nodes.items():
        if state != NodeState.READY:
            logger.info("node back node=%s was=%s", node_id, state)
            reconcile_lock.request_reconcile()
    return {
        node_id: HeartbeatResult(
            desired_version=nodes[node_id][1] if node_id in nodes else 0,
            revoked=(node_id, cred) not in live,
        )
        for node_id, cred, _hb, _at in batch
    }


def _common_writer():
    return heartbeat_pg.apply_common if connection.vendor == "postgresql" else _apply_common


def _apply_common(
    batch: list[tuple[str, int, protocol.Heartbeat, datetime]], now: datetime
) -> tuple[dict[str, tuple[str, int]], set[tuple[str, int]]]:
    """What every heartbeat carries, portably (heartbeat_pg.apply_common is the same on
    PostgreSQL in one statement). Returns ({node: (old state, desired version)},
    {(node, credential) still live}).
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
        if cred is not None:
            live.add((node_id, cred))
        nodes[node_id] = (state, desired)
        acked[node_id] = acked_version
    if nodes:
        Node.objects.filter(pk__in=list(nodes)).update(
            last_seen=now, state=NodeState.READY, connected=True
        )
    storage: dict[str, list] = {}
    loads: dict[str, tuple[protocol.Load, datetime]] = {}
    for node_id, _cred, hb, arrived in batch:
        if node_id not in nodes:
            continue
        # Disk is a fact about a moment, not a machine: replaced every time.
        if hb.storage:
            storage[node_id] = hb.storage
        if hb.load is not None:
            loads[node_id] = (hb.load, arrived)
        if hb.desired_version and hb.desired_version != acked[node_id]:
            acked[node_id] = min(hb.desired_version, nodes[node_id][1])
            Node.objects.filter(pk=node_id).update(acked_version=acked[node_id])
    if storage:
        _replace_storage(list(storage.items()))
    if loads:
        _store_loads(loads)
    return nodes, live


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
                dirty_gpus[target.pk] = target
                logger.warning(
                    "gpu problem node=%s gpu=%d problem=%s", node_id, target.index, p.problem
                )
        # Only when flagged: an empty list without the flag is silence.
        if hb.weights_changed:
            _replace_weights(node, hb.weights)
        if hb.memory_total_mb is not None and hb.memory_total_mb != node.memory_total_mb:
            logger.info(
                "node memory changed node=%s from_mb=%s to_mb=%s",
                node_id,
                node.memory_total_mb,
                hb.memory_total_mb,
            )
            node.memory_total_mb = hb.memory_total_mb
            Node.objects.filter(pk=node_id).update(memory_total_mb=hb.memory_total_mb)
        if hb.engines_changed and hb.engine_versions != node.engine_versions:
            logger.info(
                "node engines changed node=%s from=%s to=%s",
                node_id,
                sorted(node.engine_versions),
                sorted(hb.engine_versions),
            )
            node.engine_versions = hb.engine_versions
            Node.objects.filter(pk=node_id).update(engine_versions=hb.engine_versions)
        if hb.provision_changed:
            _replace_installs(node, hb.provision)
    if dirty_gpus:
        GPU.objects.bulk_update(dirty_gpus.values(), ["memory_used_mb", "problems"])


def _store_loads(loads: dict[str, tuple[protocol.Load, datetime]]) -> None:
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
        update_fields=[
            "sampled_at",
            "cpu_percent",
            "cpu_count",
            "load1",
            "load5",
            "load15",
            "memory_used_bytes",
            "memory_available_bytes",
        ],
    )
    ShardLoad.objects.filter(node_id__in=list(loads)).delete()
    ShardLoad.objects.bulk_create(
        ShardLoad(node_id=node_id, sampled_at=at, **s.model_dump())
        for node_id, (load, at) in loads.items()
        for s in load.shards
    )


def apply_shard_status(node_id: str, msg: protocol.ShardStatus) -> bool:
    """A state transition reported by the agent. Only shards of that node may be touched."""
    state = protocol.shard_state_from_wire(msg.state)
    if state == ShardState.FAILED and msg.state != ShardState.FAILED:
        logger.warning(
            "unknown shard state taken as failed node=%s shard=%s state=%r",
            node_id,
            msg.shard_id,
            msg.state,
        )
    fields = {
        "state": state,
        "error": msg.error
        or (f"agent reported unknown state '{msg.state}'" if state != msg.state else ""),
        "exit_code": msg.exit_code,
        "last_output": msg.last_output,
        "state_changed_at": timezone.now(),
    }
    updated = Shard.objects.filter(pk=msg.shard_id, node_id=node_id).update(**fields)
    if not updated:
        logger.warning(
            "status for a shard this node does not hold node=%s shard=%s", node_id, msg.shard_id
        )
        return False
    if state == ShardState.FAILED:
        logger.error(
            "shard failed node=%s shard=%s error=%s exit_code=%s last_output=%s",
            node_id,
            msg.shard_id,
            fields["error"],
            msg.exit_code,
            msg.last_output[-5:],
        )
    else:
        logger.info("shard state node=%s shard=%s state=%s", node_id, msg.shard_id, state)
    # Where requests may go has changed: every gateway reloads its table.
    transaction.on_commit(lambda: gateway_notify.changed("routes"))
    if state in (ShardState.FAILED, ShardState.READY, ShardState.STOPPED):
        reconcile_lock.request_reconcile()  # restart, roll on, or finish a drain now
    return True


def apply_fetch_progress(node_id: str, msg: protocol.FetchProgress) -> bool:
    """Progress, not a transition: the state and its timestamp stay as they are."""
    return bool(
        Shard.objects.filter(pk=msg.shard_id, node_id=node_id).update(
            fetch_source=msg.source,
            fetch_bytes_done=msg.bytes_done,
            fetch_bytes_total=msg.bytes_total,
            fetch_updated_at=timezone.now(),
        )
    )


def apply_desired_ack(node_id: str, version: int) -> None:
    from django.db.models import F
    from django.db.models.functions import Greatest, Least

    Node.objects.filter(pk=node_id).update(
        acked_version=Least(Greatest(F("acked_version"), version), F("desired_version"))
    )
