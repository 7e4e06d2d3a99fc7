"""Registrations grouped like heartbeats: a fleet coming back costs a few statements a batch.

After a control-plane restart every agent registers again within a minute or
so. One at a time, a registration was a dozen round trips and about a
millisecond of Django's query building each (docs/benchmarks.md, Agent
sockets), and a whole fleet queued on that. Here the registrations that arrive
while one batch is being written are written together by the next, as the
heartbeat writer does (``heartbeat.batching``): on PostgreSQL a batch of nodes
coming back with the inventory their last registration wrote (the usual case
after a restart; ``Node.inventory_digest``) costs one lock of their
credentials, one of their rows, one ``UPDATE ... FROM unnest(...)`` for the
rows and one for their GPUs' telemetry, one replacement of their disks, one
read of their weights, and one read of their desired sets, however many nodes
it holds.

Everything else (a new node, a node whose GPUs, fabrics or installs changed,
and every registration on SQLite) goes through ``inventory.register_node`` one
node at a time, in the batch's transaction on PostgreSQL, alone elsewhere. The
rule of every agent write holds for the whole batch: a registration is written
only while its credential is live and names its node (``access.as_node``),
with the credential's row locked; one that does not hold is refused
(``access.Revoked``) and writes nothing. A batch that fails as a whole (a
deadlock with another writer, say) is written again one registration at a
time, so one bad registration never costs the others theirs.
"""

import json
import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from agentd import protocol
from fleet.models import Node, NodeCredential

from . import access, desired, engines, inventory
from .heartbeat import changes

logger = logging.getLogger(__name__)

# At most this many registrations in one transaction: the rows stay locked
# while it runs, and heartbeats of those nodes wait for it.
MAX_BATCH = 200


@dataclass(frozen=True)
class Registration:
    credential_id: int
    msg: protocol.Register
    channel_name: str
    # Monotonic time past which the agent has stopped waiting: its socket does not
    # write it then (fleet.sockets.registrations). None: written whatever the wait.
    deadline: float | None = None
    # A second register on a socket already registered (the agent's hardware changed).
    again: bool = False

    @property
    def node_id(self) -> str:
        return self.msg.node_id


@dataclass(frozen=True)
class Registered:
    """What the agent is sent after its ack."""

    provision: protocol.Provision
    desired: protocol.Desired
    # The node's acknowledged version as the registration wrote it: an agent's ack of
    # the set it is sent next moves nothing when it is no newer (the restart wave's case).
    acked_version: int = 0


def register_many(regs: list[Registration]) -> dict[str, Registered | Exception]:
    """Write these registrations (one per node) and read what each agent is sent next.

    Returns, by node id, what the agent is sent, or the exception its
    registration ended with (``access.Revoked``), having written nothing of it.
    """
    results: dict[str, Registered | Exception] = {}
    live = regs
    written: dict[str, Node | Exception] | None = None
    if together() and len(live) > 1:
        try:
            written = _write_together(live, timezone.now())
        except DatabaseError:
            logger.warning(
                "writing %d registrations together failed; writing them one by one",
                len(live),
                exc_info=True,
            )
    if written is None:
        written = {reg.node_id: _write_alone(reg) for reg in live}
    results.update({k: v for k, v in written.items() if isinstance(v, Exception)})
    nodes = [v for v in written.values() if isinstance(v, Node)]
    if nodes:
        access.note_used(r.credential_id for r in live if isinstance(written[r.node_id], Node))
        wanted = engines.wanted()
        sets = desired.desired_sets({n.pk: n.desired_version for n in nodes})
        for n in nodes:
            results[n.pk] = Registered(
                provision=engines.provision_for(n.pk, wanted, build=n.vllm_build),
                desired=sets[n.pk],
                acked_version=n.acked_version,
            )
    return results


def together() -> bool:
    """Whether a batch is written together (PostgreSQL), or one registration at a time."""
    return connection.vendor == "postgresql"


def _write_alone(reg: Registration) -> Node | Exception:
    try:
        return access.as_node(
            reg.credential_id,
            reg.node_id,
            inventory.register_node,
            reg.msg,
            channel_name=reg.channel_name,
            again=reg.again,
        )
    except access.Revoked as exc:
        return exc


# The node row's fields a registration writes (inventory.take_registration).
_NODE_FIELDS = (
    "hostname",
    "mgmt_addr",
    "mgmt_interface",
    "agent_labels",
    "agent_version",
    "engine_versions",
    "memory_total_mb",
    "running_shards",
    "desired_version",
    "acked_version",
    "desired_lag_since",
    "state",
    "connected",
    "last_seen",
    "registered_at",
    "channel_name",
    "inventory_digest",
)


def _write_together(regs: list[Registration], now: datetime) -> dict[str, Node | Exception]:
    """PostgreSQL: the whole batch in one transaction, nodes whose inventory is unchanged
    in bulk statements."""
    out: dict[str, Node | Exception] = {}
    with transaction.atomic():
        held = dict(
            NodeCredential.objects.select_for_update()
            .filter(pk__in=[r.credential_id for r in regs], revoked_at__isnull=True)
            .order_by("pk")
            .values_list("pk", "node_id")
        )
        ok = []
        for r in regs:
            if held.get(r.credential_id) == r.node_id:
                ok.append(r)
            else:
                out[r.node_id] = access.Revoked(
                    f"credential of node '{r.node_id}' revoked or node removed"
                )
        rows = {
            n.pk: n
            for n in Node.objects.select_for_update()
            .filter(pk__in=[r.node_id for r in ok])
            .order_by("pk")
        }
        bulk: list[tuple[Registration, Node, str]] = []
        for r in ok:
            node, digest = rows.get(r.node_id), inventory.inventory_digest(r.msg)
            if node is not None and node.inventory_digest == digest:
                bulk.append((r, node, node.state))
                inventory.take_registration(node, r.msg, now, r.channel_name, digest)
            else:
                # New, or its GPUs, fabrics or installs changed: the whole inventory.
                out[r.node_id] = inventory.register_node(
                    r.msg, channel_name=r.channel_name, again=r.again
                )
        if bulk:
            nodes = [node for _, node, _ in bulk]
            _update_rows(Node, nodes, _NODE_FIELDS)
            _write_gpu_telemetry([(node.pk, r.msg.gpus) for r, node, _ in bulk])
            changes.replace_weights_of([(node.pk, r.msg.weights) for r, node, _ in bulk])
            changes.replace_storage([(node.pk, r.msg.storage) for r, node, _ in bulk])
            inventory.apply_running_shards(
                [(node, r.msg.running_shards) for r, node, _ in bulk], now
            )
    for r, node, was in bulk:
        inventory.registered(node, r.msg, was, created=False, again=r.again)
        out[r.node_id] = node
    return out


def _update_rows(model, rows: list, fields: tuple[str, ...]) -> None:
    """``UPDATE ... FROM unnest(...)``: each row's ``fields`` as they are on the instance,
    in one statement (Django's bulk_update builds a CASE per field and row, which
    costs more to build than the write)."""
    qn = connection.ops.quote_name
    pk = model._meta.pk
    cols, params = [pk], [[pk.get_db_prep_value(r.pk, connection) for r in rows]]
    for name in fields:
        f = model._meta.get_field(name)
        cols.append(f)
        params.append([_db_value(f, getattr(r, f.attname)) for r in rows])
    arrays = ", ".join(f"%s::{_db_type(f)}[]" for f in cols)
    names = ", ".join(qn(f.column) for f in cols)
    sets = ", ".join(f"{qn(f.column)} = u.{qn(f.column)}" for f in cols[1:])
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {qn(model._meta.db_table)} AS t SET {sets} "
            f"FROM unnest({arrays}) AS u({names}) WHERE t.{qn(pk.column)} = u.{qn(pk.column)}",
            params,
        )


def _db_type(field) -> str:
    return "jsonb" if field.get_internal_type() == "JSONField" else field.db_type(connection)


def _db_value(field, value):
    if field.get_internal_type() == "JSONField":
        return None if value is None else json.dumps(value)
    return field.get_db_prep_value(value, connection)


def _write_gpu_telemetry(nodes_and_gpus) -> None:
    """Every node's GPUs' moving figures (inventory.GPU_TELEMETRY), in one statement."""
    node_ids, idx, used, ecc, temp = [], [], [], [], []
    for node_id, gpus in nodes_and_gpus:
        for g in gpus:
            node_ids.append(node_id)
            idx.append(g.index)
            used.append(g.memory_used_mb)
            ecc.append(g.ecc_errors)
            temp.append(g.temperature_c)
    if not node_ids:
        return
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE fleet_gpu AS g SET memory_used_mb = u.used, ecc_errors = u.ecc, "
            "temperature_c = u.temp FROM unnest(%s::text[], %s::integer[], %s::integer[], "
            "%s::integer[], %s::integer[]) AS u(node_id, idx, used, ecc, temp) "
            'WHERE g.node_id = u.node_id AND g."index" = u.idx',
            [node_ids, idx, used, ecc, temp],
        )
