"""Draining a node, or one replica: replicas move elsewhere, replacements ready first.

``drain_node`` only records the intent (cordoned and draining) and asks for a
pass. The reconciler does the moving: a replica with a shard on a draining
node counts as outdated, so a replacement is placed elsewhere, and only once
it is ready does the old one drain (the gateway stops sending it work and
in-flight requests finish) and stop. When nothing runs there any more the
node stays cordoned and stops draining.

``evict_replica`` is the same for one replica (an operator's drain, stop or
restart): it records the ask, and the reconciler acts on it
(``fleet.services.reconciler.passes``).
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from fleet import audit
from fleet.models import (
    DesiredState,
    Event,
    EventKind,
    Evict,
    Model,
    Node,
    Replica,
    ReplicaState,
    Shard,
)

from . import nodes, permissions
from .readiness import replica_ready
from .reconciler.ask import request_reconcile

logger = logging.getLogger(__name__)


def drain_node(node: Node) -> bool:
    """Cordon the node and move its replicas away. Returns whether anything changed."""
    changed = nodes.set_intent(node, cordoned=True, draining=True)
    if changed:
        logger.info("node draining node=%s", node.pk)
        request_reconcile()
    return changed


# What each ask does, for confirmations, events and the docs.
EVICT_WORDS = {
    Evict.DRAIN: "a replacement is placed first; once it is ready this replica drains "
    "(requests in flight finish, no new ones come) and stops",
    Evict.STOP: "it drains now and stops; the model wants one replica fewer",
    Evict.RESTART: "it drains now and stops, and a new replica is placed at once",
}


def evict_replica(replica: Replica, how: str, actor) -> tuple[bool, str]:
    """An operator's drain, stop or restart of one replica: (changed, what happened).

    Permissions.Refused for an actor without ``replica.<how>``; ValueError for an
    unknown ``how``. The reconciler does the work at once (a pass is asked for).
    """
    if how not in EVICT_WORDS:
        raise ValueError(f"unknown action '{how}' (known: {', '.join(EVICT_WORDS)})")
    permissions.require_action(actor, f"replica.{how}", f"{how} replica {replica}", on=replica)
    who = permissions.name_of(actor)
    with transaction.atomic():
        r = Replica.objects.select_for_update().select_related("model").get(pk=replica.pk)
        if r.state in (ReplicaState.DRAINING, ReplicaState.STOPPED):
            return False, f"{r} is {r.state} already"
        if r.evict:
            return False, f"{r}: {r.evict} was asked already, by {r.evict_by}"
        Replica.objects.filter(pk=r.pk).update(evict=how, evict_at=timezone.now(), evict_by=who)
        audit.record(r, {"evict": ("", how)})
        if how == Evict.STOP and r.model.desired_replicas > 0:
            Model.objects.filter(pk=r.model_id, desired_replicas__gt=0).update(
                desired_replicas=F("desired_replicas") - 1
            )
            wanted = r.model.desired_replicas
            audit.record(r.model, {"desired_replicas": (wanted, wanted - 1)})
        text = f"{how} of {r} asked by {who}: {EVICT_WORDS[how]}"
        Event.objects.create(
            created_at=timezone.now(),
            kind=EventKind.REPLICA,
            model=r.model,
            model_name=r.model.name,
            reason=text,
        )
        logger.info("replica %s asked replica=%s model=%s by=%s", how, r.pk, r.model.name, who)
        transaction.on_commit(request_reconcile)
    return True, text


@dataclass
class DrainProgress:
    node_id: str
    draining: bool
    # One line per replica still on the node, saying what it waits for.
    waiting: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.draining and not self.waiting

    def __str__(self) -> str:
        if self.done:
            return f"node {self.node_id} drained: nothing runs there; it stays cordoned"
        if not self.draining:
            return f"node {self.node_id} is not draining ({len(self.waiting)} shards still there)"
        head = f"node {self.node_id}: {len(self.waiting)} replica(s) still there"
        return "\n  ".join([head, *self.waiting])


def progress(node_id: str) -> DrainProgress:
    """Where a drain stands: each replica still on the node and what it waits for."""
    draining = Node.objects.filter(pk=node_id).values_list("draining", flat=True).first()
    on_node = (
        Shard.objects.filter(node_id=node_id)
        .exclude(desired_state=DesiredState.STOPPED)
        .select_related("replica__model")
        .order_by("replica__created_at")
    )
    lines, seen = [], set()
    for shard in on_node:
        replica = shard.replica
        if replica.pk in seen:
            continue
        seen.add(replica.pk)
        lines.append(f"{replica}: {shard.state} here; {_waits_for(replica, node_id)}")
    return DrainProgress(node_id, bool(draining), lines)


def _waits_for(replica: Replica, node_id: str) -> str:
    if replica.state == ReplicaState.DRAINING:
        return "draining (in-flight requests finish)"
    if not replica_ready(replica.shards.all()):
        return "stopping (it was not serving)"
    others = list(
        Replica.objects.filter(model=replica.model_id, created_at__gt=replica.created_at)
        .exclude(state__in=[ReplicaState.DRAINING, ReplicaState.STOPPED])
        .exclude(shards__node_id=node_id)
        .distinct()
        .order_by("created_at")
        .prefetch_related("shards")
    )
    if any(replica_ready(r.shards.all()) for r in others):
        return "its replacement is ready; it drains next"
    if others:
        r = others[0]
        return f"waiting for its replacement ({r.state}" + (f": {r.reason})" if r.reason else ")")
    return "waiting for a replacement to be placed"


def wait(
    node_id: str,
    timeout_s: float,
    on_progress: Callable[[DrainProgress], None],
    tick: Callable[[], None] = lambda: time.sleep(1),
) -> DrainProgress:
    """Report progress whenever it changes until the drain is done or the time is up."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        now = progress(node_id)
        if str(now) != last:
            on_progress(now)
            last = str(now)
        if now.done or time.monotonic() >= deadline:
            return now
        tick()
