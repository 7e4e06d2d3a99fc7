"""A proposal's way to the node and back: sent only while still current, the reply recorded.

``deliver`` runs in the node's socket (fleet/sockets/events.py) under the
reconciler's lock: it checks that the node's desired-set version is still the
one the proposal was made against, marks the entries sent, and puts the
message on the socket before the lock is released. So a placement either
came first (the version moved: the proposal is dropped, nothing is removed)
or comes after the message is on its way, and then sees the entries as being
removed and places no shard needing them on that node until the node has
answered (fleet.services.snapshot).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agentd import protocol
from fleet.models import LocalWeights, Node, WeightsEvent
from fleet.services.reconciler import lock

logger = logging.getLogger(__name__)

SENT, BUSY, DROPPED, GONE = "sent", "busy", "dropped", "gone"


def deliver(node_id: str, request_id: str, version: int, send: Callable) -> str:
    """Send the proposal ``request_id`` through ``send(msg)`` if it is still current.

    Returns SENT, BUSY (a reconciler pass holds the lock: try again shortly),
    DROPPED (the node's desired set changed since: the entries are free to be
    judged again by the next pass) or GONE (nothing left to send).
    """
    with lock.pass_lock() as got:
        if not got:
            return BUSY
        rows = LocalWeights.objects.filter(
            node_id=node_id, removal_request_id=request_id, removal=LocalWeights.Removal.PROPOSED
        )
        found = list(rows.values("pk", "path", "source", "size_bytes"))
        if not found:
            return GONE
        now = timezone.now()
        current = Node.objects.filter(pk=node_id).values_list("desired_version", flat=True).first()
        if current != version:
            with transaction.atomic():
                LocalWeights.objects.filter(pk__in=[r["pk"] for r in found]).update(
                    removal="", removal_request_id="", removal_at=None
                )
                why = (
                    f"dropped before it reached the node: its desired set moved from "
                    f"v{version} to v{current} since the proposal (a placement or a stop); "
                    f"the next pass judges these weights again"
                )
                _events(node_id, found, WeightsEvent.Action.DROPPED, why, request_id, now)
            logger.info(
                "weights removal dropped node=%s request=%s proposed_at=v%d now=v%s",
                node_id,
                request_id,
                version,
                current,
            )
            return DROPPED
        LocalWeights.objects.filter(pk__in=[r["pk"] for r in found]).update(
            removal=LocalWeights.Removal.SENT, removal_at=now
        )
        send(
            protocol.RemoveWeights(
                type="remove_weights",
                paths=[r["path"] for r in found],
                desired_version=version,
                request_id=request_id,
            )
        )
        return SENT


def _events(node_id, rows, action, reason, request_id, now) -> None:
    WeightsEvent.objects.bulk_create(
        WeightsEvent(
            node_id=node_id,
            path=r["path"],
            source=r.get("source") or "",
            size_bytes=r.get("size_bytes") or 0,
            action=action,
            reason=reason[:4096],
            request_id=request_id,
            at=now,
        )
        for r in rows
    )


def record_reply(node_id: str, ack: protocol.AgentAck) -> tuple[int, int]:
    """The node's answer to a proposal: an event per entry, the removed rows gone, the
    kept ones free again (not proposed again for a while). Returns (removed, kept)."""
    now = timezone.now()
    pending = LocalWeights.objects.filter(node_id=node_id)
    if ack.request_id:
        pending = pending.filter(removal_request_id=ack.request_id)
    else:
        pending = pending.filter(removal=LocalWeights.Removal.SENT)
    rows = {r["path"]: r for r in pending.values("pk", "path", "source", "size_bytes", "shared")}
    removed = list(ack.removed)
    kept = [(k.path, k.reason) for k in ack.kept]
    if not ack.removed and not ack.kept and rows:
        # An agent from before the structured reply: its detail says it all.
        if ack.ok:
            removed = list(rows)
        else:
            kept = [(p, ack.detail or "the node kept it") for p in rows]
    reclaimed = 0
    with transaction.atomic():
        gone = []
        for path in removed:
            row = rows.get(path)
            if row is None:
                row = (
                    LocalWeights.objects.filter(node_id=node_id, path=path)
                    .values("pk", "path", "source", "size_bytes", "shared")
                    .first()
                )
            if row is None:
                continue
            reclaimed += row["size_bytes"]
            gone.append(row)
        if gone:
            LocalWeights.objects.filter(pk__in=[r["pk"] for r in gone]).delete()
            # A shared filesystem's copy is the same on every node that sees it.
            shared = [r["path"] for r in gone if r["shared"]]
            if shared:
                LocalWeights.objects.filter(path__in=shared, shared=True).delete()
            _events(
                node_id,
                gone,
                WeightsEvent.Action.REMOVED,
                "removed by the node",
                ack.request_id,
                now,
            )
        for path, reason in kept:
            row = rows.get(path) or {"path": path, "source": "", "size_bytes": 0}
            LocalWeights.objects.filter(node_id=node_id, path=path).update(
                removal="",
                removal_request_id="",
                removal_at=None,
                kept_at=now,
                kept_reason=reason[:4096],
            )
            _events(
                node_id,
                [row],
                WeightsEvent.Action.KEPT,
                f"kept by the node: {reason}",
                ack.request_id,
                now,
            )
        answered = set(removed) | {p for p, _ in kept}
        unanswered = [r["pk"] for p, r in rows.items() if p not in answered]
        if unanswered:
            LocalWeights.objects.filter(pk__in=unanswered).update(
                removal="", removal_request_id="", removal_at=None
            )
        if reclaimed:
            Node.objects.filter(pk=node_id).update(
                weights_reclaimed_bytes=F("weights_reclaimed_bytes") + reclaimed
            )
    logger.info(
        "weights removal answered node=%s request=%s removed=%d kept=%d reclaimed_bytes=%d",
        node_id,
        ack.request_id or "-",
        len(gone),
        len(kept),
        reclaimed,
    )
    if rows:
        # A placement waiting for this answer (fleet.services.snapshot) may go ahead.
        from fleet.services.reconciler import request_reconcile

        request_reconcile()
    return len(gone), len(kept)
