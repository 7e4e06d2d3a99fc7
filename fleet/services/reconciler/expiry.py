"""Node expiry: ready → suspect → lost by silence, with the fleet-wide safety checks.

Silence is counted from the last heartbeat, or from the end of the last
control-plane outage if that is later: when no pass ran for a while (the
control plane, its database or Redis was down) nobody was listening, so every
node gets a full grace period again before anything is declared lost.

If more than half of the fleet is silent at once, the likelier story is that
this control plane is the one cut off. Then nothing is declared lost and
nothing is replaced, and operators are told why; once most of the fleet is
heard again, every node gets a full grace period, so the last to come back
are not replaced in the pass before their heartbeat.
"""

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import F, Q
from django.utils import timezone

from agentd.protocol import RECONNECT_BACKOFF_CAP_S
from fleet.conf import fleet_settings
from fleet.models import FleetStatus, Node, NodeState
from fleet.services.desired import locked_nodes

from .rows import node_silence_rows

logger = logging.getLogger(__name__)


@dataclass
class Expiry:
    status: FleetStatus
    paused: bool
    # Seconds of silence of every node that is not ready, by id.
    silence: dict[str, float] = field(default_factory=dict)
    suspected: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def begin_pass(now: datetime) -> FleetStatus:
    """Lock the fleet-status row for this pass, and start a grace period after an outage.

    Writing first also takes SQLite's write lock at the start of the pass, so
    a pass never fails half-way on a lock upgrade behind a heartbeat flush.
    """
    FleetStatus.objects.get_or_create(pk=1)
    FleetStatus.objects.filter(pk=1).update(passes=F("passes") + 1)
    status = FleetStatus.objects.select_for_update().get(pk=1)
    gap_s = fleet_settings().outage_gap_s
    last = status.last_pass_at
    if last is None or (now - last).total_seconds() > gap_s:
        status.grace_from = now
        if last is None:
            logger.info("first reconciler pass: every node gets a full grace period")
        else:
            logger.warning(
                "no reconciler pass for %.0f s (an outage): every node gets a full grace period",
                (now - last).total_seconds(),
            )
    return status


def grace_from_now(now: datetime) -> bool:
    """Every node gets a full grace period from ``now``: a web process has begun taking
    agent sockets, so nodes that were silent were silent because nobody listened.

    A restart of the whole control plane can be shorter than ``outage_gap_s``,
    which the passes alone would not call an outage; yet its thousands of
    agents come back over the following seconds, the last of them a backoff or
    two after the first. Returns whether the grace period moved.
    """
    return bool(
        FleetStatus.objects.filter(pk=1)
        .filter(Q(grace_from__isnull=True) | Q(grace_from__lt=now))
        .update(grace_from=now)
    )


# An agent that lost its control plane knocks again within this (agentd.client.Backoff's
# cap): once no registration has come for this long, every agent still on its way
# back would have come.
REJOIN_QUIET_S = RECONNECT_BACKOFF_CAP_S
# How often a fleet coming back moves the grace period: one UPDATE a second, not
# one per registration.
REJOIN_MOVE_EVERY_S = 1.0


class Rejoin:
    """A web process's view of the fleet coming back to it after it started.

    The grace period of a restart (``grace_from_now``) starts at the process's
    first registration, but a fleet of thousands comes back over a minute or
    more: each agent after its backoff (up to ``REJOIN_QUIET_S``), then in the
    queue of registrations. Counted from the first one, the last tenth of a
    fleet of 1,000 was marked suspect while on its way back
    (docs/benchmarks.md, Agent sockets). So while the wave lasts, every
    registration moves the grace period to itself (at most once a second) while
    some node has not registered since the wave began: a node is silent by its
    own doing only once the fleet is back.

    The wave is over, for good in this process, at the first registration that
    finds every node that is not lost registered since the wave began (one
    EXISTS query per call; the registration writer calls once a batch), or that
    comes more than ``REJOIN_QUIET_S`` after the one before (no agent was left
    retrying: the rest are down for real). From then on a registration moves
    nothing, and a node that fails is suspect ``suspect_after_s`` after its
    last heartbeat, or after the wave's last registration if that is later.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.started: datetime | None = None
        self.last: datetime | None = None
        self.moved: datetime | None = None
        self.over = False

    def registered(self, now: datetime) -> bool:
        """A node registered here at ``now`` (its row written). Returns whether the grace
        period moved."""
        with self.lock:
            if self.over:
                return False
            if self.started is None:
                # The first registration this process takes: it (re)started.
                self.started = self.last = now
                logger.info(
                    "agents reconnecting to a new web process: "
                    "every node gets a full grace period while they come back"
                )
            quiet = (now - self.last).total_seconds()
            self.last = max(self.last, now)
            if quiet > REJOIN_QUIET_S:
                self.over = True
                logger.info("fleet back: registrations stopped for %.0f s", quiet)
                return False
            moved = False
            if self.moved is None or (now - self.moved).total_seconds() >= REJOIN_MOVE_EVERY_S:
                self.moved = now
                moved = grace_from_now(now)
            waiting = (
                Node.objects.exclude(state=NodeState.LOST)
                .filter(Q(registered_at__isnull=True) | Q(registered_at__lt=self.started))
                .exists()
            )
            if not waiting:
                self.over = True
                logger.info(
                    "fleet back: every node registered again in %.0f s",
                    (now - self.started).total_seconds(),
                )
            return moved


def silence_of(last_seen: datetime, grace_from: datetime | None, now: datetime) -> float:
    start = max(last_seen, grace_from) if grace_from else last_seen
    return max(0.0, (now - start).total_seconds())


def expire_nodes(status: FleetStatus, now: datetime) -> Expiry:
    """Move silent nodes to suspect and lost, unless most of the fleet is silent."""
    suspect_s = fleet_settings().suspect_after_s
    lost_s = fleet_settings().replace_after_s
    rows = node_silence_rows()
    silence = {nid: silence_of(seen, status.grace_from, now) for nid, _, seen in rows}
    # Nodes lost long ago are not the fleet any more; counting them would keep
    # replacement paused forever after a rack is retired without being deleted.
    fleet = [(nid, state) for nid, state, _ in rows if state != NodeState.LOST]
    silent = [nid for nid, _ in fleet if silence[nid] >= suspect_s]
    paused = bool(fleet) and 2 * len(silent) > len(fleet)
    if status.replacement_paused and not paused:
        # The fleet is coming back from a mass silence, node by node: one still
        # silent a heartbeat behind the rest must not be replaced in the pass
        # between. Every node gets a full grace period again, as after an
        # outage (and as Kubernetes does on leaving full disruption).
        status.grace_from = now
        silence = {nid: silence_of(seen, now, now) for nid, _, seen in rows}

    result = Expiry(status=status, paused=paused)
    to_suspect = [
        nid for nid, state, _ in rows if state == NodeState.READY and silence[nid] >= suspect_s
    ]
    if to_suspect:
        with locked_nodes(to_suspect):
            Node.objects.filter(pk__in=to_suspect, state=NodeState.READY).update(
                state=NodeState.SUSPECT
            )
        for nid in to_suspect:
            logger.warning("node suspect node=%s silent_s=%.0f", nid, silence[nid])
        result.suspected = to_suspect
    if not paused:
        to_lose = [
            nid for nid, state, _ in rows if state != NodeState.LOST and silence[nid] >= lost_s
        ]
        if to_lose:
            with locked_nodes(to_lose):
                Node.objects.filter(pk__in=to_lose).exclude(state=NodeState.LOST).update(
                    state=NodeState.LOST
                )
            for nid in to_lose:
                logger.error("node lost node=%s silent_s=%.0f", nid, silence[nid])
            result.lost = to_lose

    states = {nid: state for nid, state, _ in rows}
    for nid in result.suspected:
        states[nid] = NodeState.SUSPECT
    for nid in result.lost:
        states[nid] = NodeState.LOST
    result.silence = {
        nid: silence[nid] for nid, state in states.items() if state != NodeState.READY
    }

    message = ""
    if paused:
        message = (
            f"{len(silent)} of {len(fleet)} nodes are silent: assuming this control plane "
            "is the one cut off, so no node is declared lost and nothing is replaced"
        )
    if paused != status.replacement_paused:
        if paused:
            logger.error("replacement paused: %s", message)
        else:
            logger.warning("replacement resumed: %d of %d nodes silent", len(silent), len(fleet))
    status.replacement_paused = paused
    status.message = message
    status.silent_nodes = len(silent)
    status.total_nodes = len(fleet)
    return result


def may_replace_now(status: FleetStatus, now: datetime) -> bool:
    """At most one lost node's replicas are replaced per REPLACE_EVERY_S."""
    every = timedelta(seconds=fleet_settings().replace_every_s)
    return status.last_replacement_at is None or now - status.last_replacement_at >= every


def fleet_warnings(now: datetime | None = None) -> list[str]:
    """What operators must know about the reconciler itself: replacement paused, the GPU
    brake on (failed GPUs' replicas held where they are), or no passes."""
    now = now or timezone.now()
    status = FleetStatus.objects.filter(pk=1).first()
    if status is None or status.last_pass_at is None:
        return ["the reconciler has never run: start a Celery worker and beat (docs/operations.md)"]
    warnings = []
    if status.replacement_paused:
        warnings.append(f"replacement paused: {status.message}")
    if status.gpu_brake:
        warnings.append(f"GPU brake on: {status.gpu_brake}")
    idle = (now - status.last_pass_at).total_seconds()
    if idle > fleet_settings().outage_gap_s:
        warnings.append(
            f"no reconciler pass for {idle:.0f} s: nothing is placed, restarted or replaced; "
            "is the Celery worker and beat running?"
        )
    return warnings
