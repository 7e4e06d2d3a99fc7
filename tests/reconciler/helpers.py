"""Helpers for reconciler tests: agents' reports, what runs where, and a clock that moves
in beat-sized steps. Nodes and models come from ``tests.factories``."""

from datetime import timedelta

from django.utils import timezone

from agentd import protocol
from fleet.models import Node, NodeState, Replica, Shard
from fleet.services import inventory
from fleet.services.desired import desired_set
from fleet.services.reconciler import passes as reconcile
from tests.factories import register_msg


def report(shard: Shard, state: str, **fields) -> None:
    """The shard's agent reports a transition, through the real service."""
    msg = protocol.ShardStatus(type="shard_status", shard_id=shard.pk, state=state, **fields)
    inventory.apply_shard_status(shard.node_id, msg)


def shards_of(model, **filters):
    return list(
        Shard.objects.filter(replica__model=model, **filters).order_by("created_at", "rank")
    )


def running(model):
    return shards_of(model, desired_state="running")


def replicas(model, **filters):
    return list(Replica.objects.filter(model=model, **filters).order_by("created_at"))


def make_ready(model):
    for s in running(model):
        report(s, "ready")


def heartbeat(*node_ids, at):
    """Nodes heard from at ``at`` (what the heartbeat batcher writes)."""
    Node.objects.filter(pk__in=node_ids).update(last_seen=at, state=NodeState.READY)


def reregister(node_id, at, **msg_fields):
    """The node's agent registers again (after a restart or an outage), at ``at``."""
    msg = register_msg(node_id, **msg_fields)
    inventory.register_node(protocol.Register.model_validate(msg))
    Node.objects.filter(pk=node_id).update(last_seen=at, registered_at=at)


def desired(node_id):
    return {s.shard_id: s.state for s in desired_set(node_id).shards}


class Clock:
    """Reconciler passes every ``step`` seconds, as beat runs them; live nodes heartbeat."""

    def __init__(self, start=None):
        self.now = start or timezone.now()

    def pass_(self):
        return reconcile.run_pass(self.now)

    def advance(self, seconds, *, alive=(), step=5):
        reports = []
        end = self.now + timedelta(seconds=seconds)
        while self.now < end:
            self.now = min(end, self.now + timedelta(seconds=step))
            if alive:
                heartbeat(*alive, at=self.now)
            reports.append(self.pass_())
        return reports
