"""The clean-up pass: judge every entry, write what changed, and propose removals.

A pass runs under the reconciler's lock (``run_locked``), so no placement is
made while it reads which shards need which weights; each proposal is stamped
with its node's desired-set version, and ``delivery`` sends it only if that
version still holds (docs/weights.md, "Never racing placement").
"""

from __future__ import annotations

import gc
import logging
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from fleet.conf import fleet_settings
from fleet.models import LocalWeights, WeightsEvent
from fleet.services import doorbells
from fleet.services.reconciler import lock

from . import facts, rules

logger = logging.getLogger(__name__)

# Rows updated per statement: SQLite allows at most 32,766 parameters in one.
BATCH = 2000
# Events trimmed per pass at most: a clean-up works in batches (STYLE.md).
TRIM_BATCH = 5000


@dataclass
class Report:
    proposals: list[rules.Proposal] = field(default_factory=list)
    refused: list[tuple[rules.Entry, str]] = field(default_factory=list)
    waiting: list[tuple[rules.Entry, str]] = field(default_factory=list)  # asked for, later
    became_unused: int = 0
    became_used: int = 0
    requests: dict[str, str] = field(default_factory=dict)  # node -> request id
    select_ms: float = 0.0
    duration_ms: float = 0.0
    skipped: bool = False  # the lock was held by a reconciler pass

    def lines(self) -> list[str]:
        out = []
        for p in self.proposals:
            e = p.entry
            out.append(f"{e.node_id} {e.path} ({_size(e.size_bytes)}): {p.reason}")
        for e, why in self.refused:
            out.append(f"{e.node_id} {e.path}: kept although asked for: {why}")
        for e, why in self.waiting:
            out.append(f"{e.node_id} {e.path}: asked for, not yet: {why}")
        return out


def _size(n: int) -> str:
    from fleet.services.units import bytes_text

    return bytes_text(n)


@contextmanager
def _no_cycle_collection():
    """The pass makes a tuple per entry of the fleet, and nothing it makes is a cycle:
    the cyclic collector would only walk them (and everything else) again and again,
    which took half the pass at 100,000 entries (bench/weights_gc.py)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def decide(now: datetime | None = None) -> tuple[facts.Facts, rules.Decision, float]:
    """The rules over the database as it is now: (facts, decision, ms taken)."""
    now = now or timezone.now()
    started = time.perf_counter()
    with _no_cycle_collection():
        f = facts.load(now.timestamp())
        decision = rules.select(
            f.entries, f.needed, f.filesystems, f.connected, now.timestamp(), f.policy
        )
    return f, decision, (time.perf_counter() - started) * 1000


def dry_run(now: datetime | None = None) -> Report:
    """What a pass would propose now, and why; changes nothing."""
    _, decision, ms = decide(now)
    return Report(
        proposals=decision.proposals,
        refused=decision.refused,
        waiting=decision.waiting,
        select_ms=ms,
    )


def run_locked(now: datetime | None = None, wait_s: float = 0.0, first=None) -> Report:
    """A pass under the reconciler's lock; ``skipped`` when it stayed held for ``wait_s``.

    ``first``, when given, runs under the lock just before the pass (and not at
    all when the pass is skipped): what it marks is judged by this pass, not
    taken by another process's pass in between.
    """
    deadline = time.monotonic() + wait_s
    while True:
        with lock.pass_lock() as got:
            if got:
                if first is not None:
                    first()
                report = run_pass(now)
                break
        if time.monotonic() >= deadline:
            logger.debug("weights clean-up left for later: a reconciler pass holds the lock")
            return Report(skipped=True)
        time.sleep(0.2)
    # A reconciler pass asked for while this one held the lock runs now.
    if lock.take_again():
        from fleet.services.reconciler import request_reconcile

        request_reconcile()
    return report


def run_pass(now: datetime | None = None) -> Report:
    """One clean-up pass. The caller holds the reconciler's lock."""
    now = now or timezone.now()
    started = time.perf_counter()
    f, decision, select_ms = decide(now)
    report = Report(
        proposals=decision.proposals,
        refused=decision.refused,
        waiting=decision.waiting,
        became_unused=len(decision.became_unused),
        became_used=len(decision.became_used),
        select_ms=select_ms,
    )
    with transaction.atomic():
        _update(decision.became_unused, unused_since=now)
        _update(decision.became_used, unused_since=None)
        for e, why in decision.refused:
            _answered(e).update(remove_requested=False)
            _event(e, WeightsEvent.Action.KEPT, f"not removed: {why}", now=now)
        by_node: dict[str, list[rules.Proposal]] = {}
        for p in decision.proposals:
            by_node.setdefault(p.entry.node_id, []).append(p)
        for node_id, proposals in sorted(by_node.items()):
            request_id = uuid.uuid4().hex
            version = f.desired_versions.get(node_id, 0)
            propose(node_id, proposals, request_id, version, now)
            report.requests[node_id] = request_id
        trim_events(now)
    report.duration_ms = (time.perf_counter() - started) * 1000
    if report.proposals or report.refused:
        logger.info(
            "weights clean-up proposals=%d nodes=%d refused=%d became_unused=%d became_used=%d",
            len(report.proposals),
            len(report.requests),
            len(report.refused),
            report.became_unused,
            report.became_used,
        )
    return report


def _answered(e: rules.Entry):
    """The rows a judgement of ``e`` answers: its own, or every copy of a shared path
    (judged once, as one of them, while the request may sit on another)."""
    if e.shared:
        return LocalWeights.objects.filter(shared=True, path=e.path)
    return LocalWeights.objects.filter(pk=e.id)


def _update(ids: list[int], **values) -> None:
    for i in range(0, len(ids), BATCH):
        LocalWeights.objects.filter(pk__in=ids[i : i + BATCH]).update(**values)


def _event(e, action: str, reason: str, request_id: str = "", now=None) -> None:
    WeightsEvent.objects.create(
        node_id=e.node_id,
        path=e.path,
        source=e.source,
        size_bytes=e.size_bytes,
        action=action,
        reason=reason[:4096],
        request_id=request_id,
        at=now or timezone.now(),
    )


def propose(
    node_id: str, proposals: list[rules.Proposal], request_id: str, version: int, now: datetime
) -> None:
    """Mark these entries proposed, say so, and ring the node's socket after commit.

    The socket sends the proposal only while the node's desired version is
    still ``version`` (``delivery.deliver``).
    """
    ids = [p.entry.id for p in proposals]
    for p in proposals:
        LocalWeights.objects.filter(pk=p.entry.id).update(
            removal=LocalWeights.Removal.PROPOSED,
            removal_request_id=request_id,
            removal_desired_version=version,
            removal_at=now,
            removal_reason=p.reason[:255],
            remove_requested=False,
        )
        if p.entry.shared:
            _answered(p.entry).update(remove_requested=False)
    WeightsEvent.objects.bulk_create(
        WeightsEvent(
            node_id=node_id,
            path=p.entry.path,
            source=p.entry.source,
            size_bytes=p.entry.size_bytes,
            action=WeightsEvent.Action.PROPOSED,
            reason=p.reason,
            request_id=request_id,
            at=now,
        )
        for p in proposals
    )
    logger.info(
        "weights removal proposed node=%s request=%s desired_version=%d entries=%d",
        node_id,
        request_id,
        version,
        len(ids),
    )
    doorbells.ring_node(
        node_id, doorbells.NODE_REMOVE_WEIGHTS, request_id=request_id, desired_version=version
    )


def trim_events(now: datetime) -> int:
    keep_s = fleet_settings().weights_events_keep_s
    old = WeightsEvent.objects.filter(at__lt=now - timedelta(seconds=keep_s))
    ids = list(old.values_list("pk", flat=True)[:TRIM_BATCH])
    if ids:
        WeightsEvent.objects.filter(pk__in=ids).delete()
    return len(ids)
