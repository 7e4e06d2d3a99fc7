"""Folding what agents report into the inventory: registrations, shard states, acks.

Heartbeats, the frequent report, have a package of their own
(``fleet.services.heartbeat``); registration shares its change logging and
row replacement (``heartbeat.changes``).
"""

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime

from auditlog.context import disable_auditlog
from django.db import DatabaseError, connection, transaction
from django.db.models import Case, DateTimeField, F, Value, When
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from agentd import protocol
from fleet.models import GPU, FabricAttachment, GPUHealth, Node, NodeState, Shard, ShardState

from . import desired, doorbells, gpu_health
from .heartbeat import changes
from .reconciler.ask import request_reconcile

logger = logging.getLogger(__name__)


# GPU figures that move while the machine runs: left out of the inventory digest and
# written on every registration, in one statement when nothing else changed.
GPU_TELEMETRY = ("memory_used_mb", "ecc_errors", "temperature_c")


def inventory_digest(reg: protocol.Register) -> str:
    """SHA-256 of what a registration writes as rows of their own (GPUs but their telemetry,
    fabrics, engine installs): equal digests, equal rows. Weights are not in it: they are
    updated in place by path every time (``changes.replace_weights``), since their last
    use moves while the node runs."""
    facts = {
        "gpus": [g.model_dump(exclude=set(GPU_TELEMETRY)) for g in reg.gpus],
        "fabrics": [f.model_dump() for f in reg.fabrics],
        "installs": [e.model_dump() for e in reg.provision],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def register_node(reg: protocol.Register, *, channel_name: str = "", again: bool = False) -> Node:
    """Take a registration: the node's whole inventory is replaced by what it reports.

    Operator intent (cordon, drain, operator labels) is never touched. A node
    that registers again with the same GPUs, fabrics and installs as its last
    registration wrote (``Node.inventory_digest``; a heartbeat that changes
    any of them clears it) has only its GPU telemetry, weights, disks and node
    row written: after a control-plane restart the whole fleet registers at
    once, and rewriting nine tables per node was most of that wave's cost.
    ``fleet.services.registration`` writes many such registrations together.
    """
    now = timezone.now()
    digest = inventory_digest(reg)
    # No savepoint: a caller's transaction (access.as_node) rolls back as a whole.
    # Nothing an operator sets is written here: no audit entry (and no read of the old row).
    with transaction.atomic(savepoint=False), disable_auditlog():
        node, created = Node.objects.select_for_update().get_or_create(pk=reg.node_id)
        was = node.state
        same = not created and node.inventory_digest == digest
        take_registration(node, reg, now, channel_name, digest, created=created)
        node.save()

        if same:
            _write_gpu_telemetry(node, reg.gpus)
        else:
            # A GPU's fault outlives its row: held out until an operator clears it,
            # whatever the agent says at its next start (fleet.services.gpu_health).
            kept = {
                row["uuid"]: row
                for row in GPU.objects.filter(node=node)
                .exclude(fault=GPUHealth.HEALTHY, slowdowns=[], xids={}, drained_at=None)
                .values("uuid", *gpu_health.KEPT_FIELDS)
            }
            GPU.objects.filter(node=node).delete()
            new_gpus = []
            for g in reg.gpus:
                gpu = GPU(node=node, **g.model_dump())
                for field, value in kept.get(g.uuid, {}).items():
                    setattr(gpu, field, value)
                gpu_health.refresh(gpu, now, quiet=True)
                new_gpus.append(gpu)
            GPU.objects.bulk_create(new_gpus)
            node.fabrics.all().delete()
            FabricAttachment.objects.bulk_create(
                FabricAttachment(node=node, **f.model_dump()) for f in reg.fabrics
            )
            changes.replace_installs(node, reg.provision)
        changes.replace_weights(node, reg.weights)
        changes.replace_storage([(node.pk, reg.storage)])
        apply_running_shards([(node, reg.running_shards)], now)
    registered(node, reg, was, created, again)
    return node


def take_registration(
    node: Node,
    reg: protocol.Register,
    now: datetime,
    channel_name: str,
    digest: str,
    *,
    created: bool = False,
) -> None:
    """Set the node row's fields from a registration (not saved): everything the agent
    reports, and a new session's desired-set bookkeeping."""
    if not created:
        changes.memory_changed(node.pk, node.memory_total_mb, reg.memory_total_mb)
        changes.engines_changed(node.pk, node.engine_versions, reg.engine_versions)
    node.hostname = reg.hostname
    node.mgmt_addr = reg.mgmt_addr
    node.mgmt_interface = reg.mgmt_interface
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
    # A new session: the whole set goes out now, so a node still behind is
    # timed from here, not from before it went away.
    behind = node.acked_version < node.desired_version
    node.desired_lag_since = now if behind else None
    node.state = NodeState.READY
    node.connected = True
    node.last_seen = now
    node.registered_at = now
    if channel_name:
        node.channel_name = channel_name
    node.inventory_digest = digest


def registered(
    node: Node, reg: protocol.Register, was: str, created: bool, again: bool = False
) -> None:
    """What a registration is worth in the log (and to the gateways), once committed."""
    if was != NodeState.READY and not created:
        logger.info("node back node=%s was=%s", node.pk, was)
        doorbells.ring_gateways("routes")  # no longer only a last resort
    logger.info(
        "agent %s node=%s gpus=%d fabrics=%s running_shards=%d agent_version=%s",
        "re-registered" if again else "registered",
        node.pk,
        len(reg.gpus),
        [f.fabric for f in reg.fabrics],
        len(reg.running_shards),
        reg.agent_version,
    )


def _write_gpu_telemetry(node: Node, gpus) -> None:
    """The GPUs' moving figures, in one statement (the rows are as the digest says).

    Plain SQL: the ORM's Case/When for three columns of eight GPUs cost more to
    build than the rest of the registration together.
    """
    if not gpus:
        return
    qn = connection.ops.quote_name
    sets, params = [], []
    for name in GPU_TELEMETRY:
        whens = " ".join("WHEN %s THEN %s" for _ in gpus)
        sets.append(f"{qn(name)} = CASE {qn('index')} {whens} ELSE {qn(name)} END")
        for g in gpus:
            params += [g.index, getattr(g, name)]
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {qn(GPU._meta.db_table)} SET {', '.join(sets)} WHERE {qn('node_id')} = %s",
            [*params, node.pk],
        )


def apply_running_shards(nodes_and_running, now: datetime) -> None:
    """What each agent runs is the truth about the shards it holds for its node: one read
    for all the nodes given, as (node, running shards) pairs."""
    wanted = {(node.pk, s.shard_id): s for node, running in nodes_and_running for s in running}
    if not wanted:
        return  # nothing to read: most nodes of a fleet coming back run nothing yet
    node_ids = {node_id for node_id, _ in wanted}
    shard_ids = {shard_id for _, shard_id in wanted}
    for shard in Shard.objects.filter(node_id__in=node_ids, pk__in=shard_ids):
        said = wanted.get((shard.node_id, shard.pk))
        if said is None:
            continue  # another node's shard of the same id: not this agent's to say
        state = protocol.shard_state_from_wire(said.state)
        if shard.state != state:
            shard.state = state
            shard.state_changed_at = now
            shard.save(update_fields=["state", "state_changed_at"])
            doorbells.ring_gateways("routes")


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


@dataclass(frozen=True)
class Disconnect:
    """A socket that closed, for ``mark_disconnected_many``."""

    node_id: str
    channel_name: str


def mark_disconnected_many(closed: list[Disconnect]) -> dict[str, bool | Exception]:
    """``mark_disconnected`` for many sockets in one transaction: {node: whether its
    socket held it, or the error that stopped it}. A web process stopping closes all
    of its sockets at once; one commit each kept a stop with 5,000 agents going for
    over 10 s.

    Rows are taken in node order, as registrations take them, so the two do not
    deadlock; should the batch fail all the same, each node is written on its own.
    """
    ordered = sorted(closed, key=lambda d: d.node_id)
    try:
        with transaction.atomic():
            return {d.node_id: mark_disconnected(d.node_id, d.channel_name) for d in ordered}
    except DatabaseError as exc:
        logger.warning(
            "marking %d nodes disconnected together failed (%s); one by one", len(ordered), exc
        )
    out: dict[str, bool | Exception] = {}
    for d in ordered:
        try:
            out[d.node_id] = mark_disconnected(d.node_id, d.channel_name)
        except DatabaseError as exc:
            out[d.node_id] = exc
    return out


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
        # A report of the same state (its adapters changed) restarts no timer.
        "state_changed_at": Case(
            When(state=state, state_changed_at__isnull=False, then=F("state_changed_at")),
            default=Value(timezone.now()),
            output_field=DateTimeField(),
        ),
    }
    if msg.adapters is not None:
        fields["adapters"] = [a.model_dump(mode="json") for a in msg.adapters]
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
    doorbells.ring_gateways("routes")
    if state in (ShardState.FAILED, ShardState.READY, ShardState.STOPPED, ShardState.ASLEEP):
        request_reconcile()  # restart, roll on, finish a drain, or wake what waits for room
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
    """Forward only, and never past the node's desired version (docs/protocol.md)."""
    acked = Least(Greatest(F("acked_version"), Value(version)), F("desired_version"))
    Node.objects.filter(pk=node_id).update(
        acked_version=acked, desired_lag_since=desired.lag_since_after(acked, timezone.now())
    )
