"""GPU faults and a node's notice of going away (docs/operations.md, "GPU faults and notices").

A GPU's health is the worst of three things:

- its **fault**: what its critical events (XIDs, double-bit ECC) meant, by the
  table in ``agentd.xid``. A driver delivers an event once and never says it is
  over, so a fault stays until an operator clears it (after a reset or a swap);
- its **problems**: what the agent reads on it now (retired pages, a pending
  row remap, not readable through NVML), as before;
- its **slowdowns**: harmful clock slowdowns now (thermal, hardware), which end
  by themselves.

Degraded: nothing new is placed on it; what runs there stays. Failed: its
replicas are moved away too, the way an operator's drain of one replica moves
them (a replacement first, in-flight requests finish, at most
``LLMGW_GPU_DRAIN_WAIT_S`` for the replacement), and it stays out until cleared.
A fault is acted on as its XID's row in the table says: ``fail`` fails the GPU;
``drain`` (a contained ECC error: the engine that met it must restart) leaves
it degraded and moves what runs there, so the engine restarts on another GPU.

The mass-failure brake: within ``LLMGW_GPU_BRAKE_WINDOW_S``, at most
``LLMGW_GPU_FAILURE_BRAKE`` of the fleet's GPUs (at least one) are drained for
failures. More failing at once is likelier a driver fault than that many GPUs:
the rest keep their replicas, and the brake stays on, said on the cluster page,
until an operator clears them (or drains their nodes by hand).

A notice (a spot reclaim, a maintenance window) drains the node at once,
replacements first; what is still there ``LLMGW_NOTICE_DRAIN_S`` before the
deadline drains anyway, so its requests finish before the machine goes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agentd import protocol, xid
from fleet import audit
from fleet.conf import fleet_settings
from fleet.models import GPU, Event, EventKind, FleetStatus, GPUHealth, Node

from . import nodes, permissions
from .reconciler.ask import request_reconcile

logger = logging.getLogger(__name__)

_RANK = {GPUHealth.HEALTHY: 0, GPUHealth.DEGRADED: 1, GPUHealth.FAILED: 2}

# The cluster page's and the API's words for the brake's state.
BRAKE_ADVICE = (
    "clear the GPUs that are fine (llmgw gpu clear NODE/INDEX --reason ...), or drain "
    "the nodes of those that are not (llmgw drain NODE)"
)


class GPUNotFound(LookupError):
    """No GPU by that name. The message names it."""


def get_gpu(name: str) -> GPU:
    """A GPU by ``NODE/INDEX`` (``node-1/0``) or ``NODE/gpuINDEX`` as pages show it."""
    node_id, sep, index = name.rpartition("/")
    index = index.removeprefix("gpu")
    if not sep or not node_id or not index.isdigit():
        raise GPUNotFound(f"'{name}' is not a GPU: name it NODE/INDEX, like node-1/0")
    gpu = GPU.objects.filter(node_id=node_id, index=int(index)).first()
    if gpu is None:
        raise GPUNotFound(f"no GPU {index} on node '{node_id}'")
    return gpu


def worst(*states: str) -> str:
    return max(states, key=lambda s: _RANK.get(s, 0))


def health_of(gpu: GPU) -> tuple[str, str]:
    """(state, reason) from its fault, problems and slowdowns; the worst decides, and
    among equals the fault (the cause) comes before what it left behind."""
    found: list[tuple[str, str]] = []
    if gpu.fault != GPUHealth.HEALTHY:
        found.append((gpu.fault, gpu.fault_reason))
    found += [(str(xid.problem_state(p)), p) for p in gpu.problems]
    found += [(GPUHealth.DEGRADED, f"clocks slowed: {s}") for s in gpu.slowdowns]
    if not found:
        return GPUHealth.HEALTHY, ""
    found.sort(key=lambda f: -_RANK[f[0]])
    return found[0][0], found[0][1][:255]


def refresh(gpu: GPU, now: datetime, quiet: bool = False) -> bool:
    """Set ``health`` from its parts; an event when it changed (not ``quiet``: a
    registration's new row). Returns whether it did."""
    state, reason = health_of(gpu)
    if (state, reason) == (gpu.health, gpu.health_reason):
        return False
    was = gpu.health
    gpu.health, gpu.health_reason = state, reason
    if state == was or quiet:
        return True  # a new reason, the same state: no event
    text = f"GPU {gpu}: {was} → {state}" + (f" ({reason})" if reason else "")
    if state == GPUHealth.FAILED:
        text += ": its replicas move elsewhere, and it stays out until an operator clears it"
    elif state == GPUHealth.DEGRADED:
        text += ": nothing new is placed on it"
    logger.warning(
        "gpu health node=%s gpu=%d %s → %s reason=%s", gpu.node_id, gpu.index, was, state, reason
    )
    Event.objects.create(
        created_at=now, kind=EventKind.GPU, model_name="", node_id=gpu.node_id, reason=text
    )
    return True


HEALTH_FIELDS = [
    "health",
    "health_reason",
    "fault",
    "fault_reason",
    "fault_at",
    "slowdowns",
    "xids",
]
# What a registration keeps of a GPU's row it rewrites (fleet.services.inventory).
KEPT_FIELDS = ["fault", "fault_reason", "fault_at", "slowdowns", "xids", "drained_at"]


def apply_gpu_events(node_id: str, msg: protocol.GPUEvents) -> None:
    """An agent's critical GPU events and changed slowdowns: faults kept, health set, a
    reconciler pass asked for where one got worse."""
    now = timezone.now()
    worse = False
    with transaction.atomic():
        gpus = {g.index: g for g in GPU.objects.select_for_update().filter(node_id=node_id)}
        dirty: dict[int, GPU] = {}
        for report in msg.events:
            gpu = gpus.get(report.gpu_index)
            if gpu is None:
                logger.warning(
                    "gpu event for a GPU the node did not register node=%s gpu=%d kind=%s",
                    node_id, report.gpu_index, report.kind,
                )  # fmt: skip
                continue
            if report.kind == xid.XID_EVENT and report.xid is not None:
                key = str(report.xid)
                gpu.xids = {**gpu.xids, key: int(gpu.xids.get(key, 0)) + 1}
            action, reason = xid.event_finding(
                xid.GPUEvent(report.gpu_index, gpu.uuid, report.kind, report.xid)
            )
            state = {xid.Action.DRAIN: GPUHealth.DEGRADED, xid.Action.FAIL: GPUHealth.FAILED}.get(
                action
            )
            if state is not None and _RANK[state] > _RANK[GPUHealth(gpu.fault)]:
                gpu.fault, gpu.fault_reason, gpu.fault_at = state, reason[:255], now
            dirty[gpu.index] = gpu
        for slow in msg.slowdowns:
            gpu = gpus.get(slow.gpu_index)
            if gpu is not None and list(slow.reasons) != gpu.slowdowns:
                gpu.slowdowns = list(slow.reasons)
                dirty[gpu.index] = gpu
        for gpu in dirty.values():
            was = gpu.health
            refresh(gpu, now)
            worse |= _RANK[GPUHealth(gpu.health)] > _RANK[GPUHealth(was)]
        if dirty:
            GPU.objects.bulk_update(dirty.values(), HEALTH_FIELDS)
            # The rows changed outside a registration: the next one rewrites them.
            Node.objects.filter(pk=node_id).exclude(inventory_digest="").update(inventory_digest="")
    if worse:
        request_reconcile()


def refresh_node(node_id: str, now: datetime) -> None:
    """After a registration or new problems rewrote a node's GPUs: their health again."""
    changed = []
    for gpu in GPU.objects.select_for_update().filter(node_id=node_id):
        if refresh(gpu, now):
            changed.append(gpu)
    if changed:
        GPU.objects.bulk_update(changed, ["health", "health_reason"])


def clear(gpu: GPU, actor, reason: str) -> tuple[bool, str]:
    """An operator clears a GPU's fault (it was reset or swapped, or the event was the
    driver's): it may be placed on again. Its problems and slowdowns are what the agent
    reads now, and stay. Permissions.Refused without ``gpu.clear``; ValueError without
    a reason."""
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("say why the GPU is fine again: the audit trail keeps it")
    permissions.require_action(actor, "gpu.clear", f"clear GPU {gpu}")
    who = permissions.name_of(actor)
    now = timezone.now()
    with transaction.atomic():
        g = GPU.objects.select_for_update().get(pk=gpu.pk)
        if g.fault == GPUHealth.HEALTHY and g.drained_at is None:
            return False, f"GPU {g} has no fault to clear ({g.health})"
        before = {f: getattr(g, f) for f in ("fault", "fault_reason", "drained_at")}
        g.fault, g.fault_reason, g.fault_at, g.drained_at = GPUHealth.HEALTHY, "", None, None
        refresh(g, now)
        g.save(update_fields=[*HEALTH_FIELDS, "drained_at"])
        audit.record(
            g, {f: (v, getattr(g, f)) for f, v in before.items()} | {"reason": ("", reason)}
        )
        text = f"GPU {g} cleared by {who}: {reason}; it is {g.health} now"
        Event.objects.create(
            created_at=now, kind=EventKind.GPU, model_name="", node_id=g.node_id, reason=text
        )
        logger.info("gpu cleared node=%s gpu=%d by=%s reason=%s", g.node_id, g.index, who, reason)
        transaction.on_commit(request_reconcile)
    return True, text


# ---- the reconciler's part -------------------------------------------------------------


@dataclass
class Faults:
    """What a pass does about failed GPUs: the GPUs whose replicas move now. (The
    brake's state is on ``FleetStatus.gpu_brake``, which the pass saves.)"""

    # (node id, GPU uuid) -> when its replicas began to move
    moving: dict[tuple[str, str], datetime]


def step(status: FleetStatus, now: datetime) -> Faults:
    """Release failed GPUs to be drained, at most the brake's bound; set or lift the
    brake on ``status`` (saved by the pass). Called inside the pass's transaction."""
    conf = fleet_settings()
    # A fault of either kind moves what runs there; a degraded GPU's problems or
    # slowdowns alone do not.
    failed = list(
        GPU.objects.exclude(fault=GPUHealth.HEALTHY).order_by("fault_at", "node_id", "index")
    )
    held = [g for g in failed if g.drained_at is None]
    # An operator draining the node of a held GPU moves its replicas: it is held no more.
    by_hand = set(
        Node.objects.filter(pk__in={g.node_id for g in held}, draining=True).values_list(
            "pk", flat=True
        )
    )
    if by_hand:
        for g in held:
            if g.node_id in by_hand:
                g.drained_at = now
        GPU.objects.bulk_update([g for g in held if g.node_id in by_hand], ["drained_at"])
        held = [g for g in held if g.node_id not in by_hand]
    if held:
        total = GPU.objects.count()
        bound = max(1, math.ceil(total * conf.gpu_failure_brake))
        recent = GPU.objects.filter(
            drained_at__gte=now - timedelta(seconds=conf.gpu_brake_window_s)
        ).count()
        room = 0 if status.gpu_brake else max(0, bound - recent)
        release = held[:room]
        for g in release:
            g.drained_at = now
            Event.objects.create(
                created_at=now,
                kind=EventKind.GPU,
                model_name="",
                node_id=g.node_id,
                reason=f"GPU {g} {g.fault} ({g.fault_reason}): its replicas move elsewhere, "
                "replacements first",
            )
            logger.warning(
                "gpu drained node=%s gpu=%d reason=%s", g.node_id, g.index, g.health_reason
            )
        if release:
            GPU.objects.bulk_update(release, ["drained_at"])
        held = held[room:]
        if held and not status.gpu_brake:
            status.gpu_brake = (
                f"{len(failed)} of {total} GPUs faulted; at most {bound} are drained in "
                f"{conf.gpu_brake_window_s:g} s (LLMGW_GPU_FAILURE_BRAKE "
                f"{conf.gpu_failure_brake:g}): that many at once is likelier a driver or "
                f"firmware fault, so the replicas of {len(held)} stay where they are. "
                f"{BRAKE_ADVICE[0].upper()}{BRAKE_ADVICE[1:]}."
            )
            logger.error("gpu brake on: %s", status.gpu_brake)
            Event.objects.create(
                created_at=now, kind=EventKind.GPU, model_name="", reason=status.gpu_brake
            )
    if not held and status.gpu_brake:
        logger.warning("gpu brake off: no failed GPU is held")
        Event.objects.create(
            created_at=now,
            kind=EventKind.GPU,
            model_name="",
            reason="the GPU brake is off: no failed GPU's replicas are held",
        )
        status.gpu_brake = ""
    moving = {(g.node_id, g.uuid): g.drained_at for g in failed if g.drained_at is not None}
    return Faults(moving)


# ---- a node's notice -------------------------------------------------------------------


def give_notice(node: Node, in_s: float, source: str, reason: str = "", actor=None) -> str:
    """The node goes away in ``in_s`` seconds: drain it now, replacements first, and
    drain what is left ``LLMGW_NOTICE_DRAIN_S`` before the deadline regardless.
    ``actor`` None: the node's own agent said so (its credential is the check). An
    earlier deadline replaces a later one; a later one changes nothing."""
    if not 0 <= in_s <= protocol.NOTICE_MAX_S:
        raise ValueError(f"a notice is 0 to {protocol.NOTICE_MAX_S} s ahead, not {in_s:g} s")
    if actor is not None:
        permissions.require_action(actor, "node.notice", f"give node {node.pk} notice")
    now = timezone.now()
    deadline = now + timedelta(seconds=in_s)
    who = "its agent" if actor is None else permissions.name_of(actor)
    with transaction.atomic():
        n = Node.objects.select_for_update().get(pk=node.pk)
        if n.notice_deadline is not None and n.notice_deadline <= deadline:
            return f"node {n.pk} has notice already: it goes at {n.notice_deadline:%H:%M:%S}"
        Node.objects.filter(pk=n.pk).update(
            notice_deadline=deadline, notice_source=source[:64], notice_reason=reason[:255]
        )
        audit.record(n, {"notice_deadline": (n.notice_deadline, deadline)})
        nodes.set_intent(n, cordoned=True, draining=True)
        text = (
            f"node {n.pk} goes away in {in_s:.0f} s ({source}"
            + (f": {reason}" if reason else "")
            + f", said by {who}): draining it now, replacements first"
        )
        Event.objects.create(
            created_at=now, kind=EventKind.NOTICE, model_name="", node_id=n.pk, reason=text
        )
        logger.warning(
            "node notice node=%s in_s=%.0f source=%s reason=%s", n.pk, in_s, source, reason
        )
        transaction.on_commit(request_reconcile)
    return text


def leaving_now(now: datetime) -> set[str]:
    """Nodes whose notice is so near that what runs there drains whatever its
    replacement's state."""
    cutoff = now + timedelta(seconds=fleet_settings().notice_drain_s)
    return set(Node.objects.filter(Q(notice_deadline__lte=cutoff)).values_list("pk", flat=True))
