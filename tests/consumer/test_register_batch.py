"""Registrations written in batches (fleet.services.registration): what a batch leaves in
the inventory, on every write path.

On PostgreSQL nodes coming back with an unchanged inventory are written together
in bulk statements; elsewhere, and for every other registration, one at a time
by ``inventory.register_node``. Each test runs on every path the database
offers, and on PostgreSQL the two paths must leave the same rows.
"""

import asyncio

import pytest
from django.db import DatabaseError, transaction
from django.utils import timezone

from agentd import protocol
from fleet.models import GPU, FabricAttachment, LocalWeights, Node, NodeCredential, Shard, Storage
from fleet.services import access, inventory, registration
from fleet.sockets import db as socket_db
from fleet.sockets import registrations
from tests.consumer.conftest import ON_POSTGRES
from tests.factories import H100_GPUS, make_shard, register_msg

pytestmark = pytest.mark.django_db

PATHS = ["alone", "together"] if ON_POSTGRES else ["alone"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """How a batch is written: "alone" (one by one, the portable path) or "together"."""
    if request.param == "alone":
        monkeypatch.setattr(registration, "together", lambda: False)
    return request.param


def reg(node_id, **fields) -> protocol.Register:
    return protocol.parse_agent_message(register_msg(node_id, **fields))


def enrolled(node_id, **fields) -> int:
    """A node registered once, with its credential: as the fleet was before a restart."""
    inventory.register_node(reg(node_id, **fields), channel_name="old")
    Node.objects.filter(pk=node_id).update(connected=False, channel_name="")
    cred, _ = NodeCredential.issue(node=Node.objects.get(pk=node_id))
    return cred.pk


def the_fleet_comes_back():
    """Six nodes coming back at once after a restart, each in its own way; returns the
    batch's results and the rows it left."""
    gpus = [
        dict(g, memory_used_mb=1000 * g["index"], temperature_c=40 + g["index"]) for g in H100_GPUS
    ]
    creds = {n: enrolled(n) for n in ("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05")}
    make_shard("gpu-02", shard_id="s-02", state="starting")
    NodeCredential.objects.filter(pk=creds["gpu-05"]).update(revoked_at=timezone.now())
    # enrolled with a join token, never registered: a node row and nothing else
    Node.objects.create(pk="gpu-06")
    creds["gpu-06"] = NodeCredential.issue(node=Node.objects.get(pk="gpu-06"))[0].pk
    Node.objects.filter(pk="gpu-04").update(desired_version=3, acked_version=1)
    batch = [
        # the usual case: nothing changed but the moving figures
        reg(
            "gpu-01",
            gpus=gpus,
            storage=[{"path": "/var/lib/llmgw", "free_bytes": 5, "total_bytes": 9}],
        ),
        # runs a shard it now reports ready
        reg("gpu-02", running_shards=[{"shard_id": "s-02", "state": "ready"}], hostname="two"),
        # a GPU fewer: its whole inventory is written again
        reg("gpu-03", gpus=H100_GPUS[:7], fabrics=[]),
        # weights replaced, behind on its desired set
        reg("gpu-04", weights=[{"path": "/models/llama", "size_bytes": 7}], desired_version=1),
        reg("gpu-05"),  # its credential was revoked meanwhile
        reg("gpu-06", labels={"zone": "b"}),
    ]
    results = registration.register_many(
        [
            registration.Registration(
                credential_id=creds[r.node_id], msg=r, channel_name=f"ch-{r.node_id}"
            )
            for r in batch
        ]
    )
    return results, rows()


def rows():
    """Every row a registration writes, with the times left out (they are the batch's)."""
    nodes = {
        n.pk: (
            n.hostname,
            n.agent_labels,
            n.state,
            n.connected,
            n.channel_name,
            n.inventory_digest,
            n.desired_version,
            n.acked_version,
            n.desired_lag_since is not None,
            n.registered_at is not None,
            n.running_shards,
            n.memory_total_mb,
        )
        for n in Node.objects.all()
    }
    return {
        "nodes": nodes,
        "gpus": sorted(
            GPU.objects.values_list("node_id", "index", "uuid", "memory_used_mb", "temperature_c")
        ),
        "fabrics": sorted(FabricAttachment.objects.values_list("node_id", "fabric")),
        "storage": sorted(Storage.objects.values_list("node_id", "path", "free_bytes")),
        "weights": sorted(LocalWeights.objects.values_list("node_id", "path", "size_bytes")),
        "shards": sorted(Shard.objects.values_list("pk", "node_id", "state")),
    }


def test_a_batch_writes_each_registration_as_registering_it_alone_would(path):
    results, after = the_fleet_comes_back()

    # every live node is registered, connected, on its new socket, and sent its sets
    for node_id in ("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-06"):
        sent = results[node_id]
        assert isinstance(sent, registration.Registered)
        assert sent.desired.version == after["nodes"][node_id][6]
        hostname, _, state, connected, channel, *_ = after["nodes"][node_id]
        assert (state, connected, channel) == ("ready", True, f"ch-{node_id}")
    assert after["nodes"]["gpu-02"][0] == "two"
    assert [s.shard_id for s in results["gpu-02"].desired.shards] == ["s-02"]
    # the moving figures of an unchanged inventory are written
    assert [g[3:] for g in after["gpus"] if g[0] == "gpu-01"] == [
        (1000 * i, 40 + i) for i in range(8)
    ]
    assert ("gpu-01", "/var/lib/llmgw", 5) in after["storage"]
    # a changed inventory is rewritten whole
    assert len([g for g in after["gpus"] if g[0] == "gpu-03"]) == 7
    assert [f for f in after["fabrics"] if f[0] == "gpu-03"] == []
    assert [w for w in after["weights"] if w[0] == "gpu-04"] == [("gpu-04", "/models/llama", 7)]
    # what the agent runs is the truth; a node behind is timed from now
    assert ("s-02", "gpu-02", "ready") in after["shards"]
    assert after["nodes"]["gpu-04"][6:9] == (3, 1, True)
    assert after["nodes"]["gpu-06"][1] == {"zone": "b"}
    assert len([g for g in after["gpus"] if g[0] == "gpu-06"]) == 8
    # a revoked credential: refused, and nothing of it written
    assert isinstance(results["gpu-05"], access.Revoked)
    assert after["nodes"]["gpu-05"][3:5] == (False, "")


def test_every_write_path_leaves_the_same_rows(monkeypatch):
    seen = {}
    for name in PATHS:
        with monkeypatch.context() as m:
            if name == "alone":
                m.setattr(registration, "together", lambda: False)
            with transaction.atomic():
                results, after = the_fleet_comes_back()
                seen[name] = ({k: type(v).__name__ for k, v in results.items()}, after)
                transaction.set_rollback(True)
    assert all(s == seen["alone"] for s in seen.values())


def test_a_registration_whose_agent_stopped_waiting_is_not_written(path):
    cred = enrolled("gpu-01")
    before = Node.objects.get(pk="gpu-01").registered_at
    cred2 = enrolled("gpu-02")

    results = registrations.register_batch(
        [
            registration.Registration(cred, reg("gpu-01", hostname="late"), "ch", deadline=0.0),
            registration.Registration(cred2, reg("gpu-02"), "ch2"),
        ]
    )

    assert isinstance(results["gpu-01"], socket_db.TooLate)
    node = Node.objects.get(pk="gpu-01")
    assert (node.hostname, node.registered_at) == ("gpu-01.example", before)
    assert isinstance(results["gpu-02"], registration.Registered)


async def test_registrations_arriving_during_a_write_go_in_the_next_batch_one_per_node():
    batches = []

    def write(regs):
        batches.append([r.node_id for r in regs])
        return {r.node_id: r.node_id for r in regs}

    b = socket_db.NodeBatcher(write, registration.MAX_BATCH, "registrations")
    msgs = [reg(n) for n in ("gpu-01", "gpu-02", "gpu-01", "gpu-03")]
    got = await asyncio.gather(*(b.submit(registration.Registration(1, m, "ch")) for m in msgs))

    assert got == ["gpu-01", "gpu-02", "gpu-01", "gpu-03"]
    # together, but for gpu-01's second registration, which waits for the batch
    # holding its first: a node's writes stay in order
    assert batches == [["gpu-01", "gpu-02", "gpu-03"], ["gpu-01"]]


def test_a_credentials_last_use_is_written_with_its_registration_not_its_handshake(path):
    creds = {n: enrolled(n) for n in ("gpu-01", "gpu-02")}
    secret = NodeCredential.issue(node=Node.objects.get(pk="gpu-01"))[1]
    NodeCredential.objects.update(last_used_at=None)

    # the handshake only reads
    assert access.identify(secret).node_id == "gpu-01"
    assert set(NodeCredential.objects.values_list("last_used_at", flat=True)) == {None}

    results = registration.register_many(
        [registration.Registration(creds[n], reg(n), "ch") for n in creds]
    )

    assert all(isinstance(r, registration.Registered) for r in results.values())
    used = dict(NodeCredential.objects.values_list("pk", "last_used_at"))
    assert all(used[c] is not None for c in creds.values())


def test_closed_sockets_are_marked_together_but_only_where_they_still_hold_the_node():
    for node_id, channel in (("gpu-01", "a"), ("gpu-02", "b"), ("gpu-03", "new")):
        inventory.register_node(reg(node_id), channel_name=channel)
    # gpu-03 reconnected before its old socket's close was written
    closed = [("gpu-01", "a"), ("gpu-02", "b"), ("gpu-03", "old")]

    held = inventory.mark_disconnected_many([inventory.Disconnect(*c) for c in closed])

    assert held == {"gpu-01": True, "gpu-02": True, "gpu-03": False}
    rows = dict(Node.objects.values_list("pk", "connected"))
    assert rows == {"gpu-01": False, "gpu-02": False, "gpu-03": True}
    assert Node.objects.get(pk="gpu-03").channel_name == "new"


def test_a_closed_socket_whose_write_fails_costs_only_its_own_node(monkeypatch):
    for node_id in ("gpu-01", "gpu-02", "gpu-03"):
        inventory.register_node(reg(node_id), channel_name=node_id)
    real = inventory.mark_disconnected

    def failing(node_id, channel_name):
        if node_id == "gpu-02":
            raise DatabaseError("deadlock detected")
        return real(node_id, channel_name)

    monkeypatch.setattr(inventory, "mark_disconnected", failing)
    closed = [inventory.Disconnect(n, n) for n in ("gpu-03", "gpu-02", "gpu-01")]

    held = inventory.mark_disconnected_many(closed)

    # the batch failed as a whole, and was written again one node at a time
    assert (held["gpu-01"], held["gpu-03"]) == (True, True)
    assert isinstance(held["gpu-02"], DatabaseError)
    rows = dict(Node.objects.values_list("pk", "connected"))
    assert rows == {"gpu-01": False, "gpu-02": True, "gpu-03": False}
