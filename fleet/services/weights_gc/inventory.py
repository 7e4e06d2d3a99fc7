"""Weights per node as operators see them, and what operators may do about them.

The admin, the API and ``manage.py weights`` list entries through ``listing``
and act through ``set_pinned`` and ``request_removal``; a removal an operator
asks for still goes through a pass (unused only) and the node's re-check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from fleet import audit
from fleet.models import SHARD_FINISHED, DesiredState, LocalWeights, Shard
from fleet.services.weight_names import Wanted


@dataclass
class Item:
    """One entry with what uses it (computed from the shards, not stored)."""

    row: LocalWeights
    used_by: list[str] = field(default_factory=list)  # "model (shard id)"

    @property
    def unused(self) -> bool:
        return not self.used_by

    @property
    def last_used(self) -> datetime | None:
        """The later of the node's word and the control plane's (when it stopped being
        needed); None while in use (it is in use now) or never seen used."""
        r = self.row
        times = [t for t in (r.last_used_at, r.unused_since) if t is not None]
        return max(times) if times else None

    @property
    def last_used_text(self) -> str:
        """ "in use now", the time it was last used (local), or "-": as the admin, the
        console's node page and ``manage.py weights`` show it."""
        if not self.unused:
            return "in use now"
        at = self.last_used
        return timezone.localtime(at).strftime("%Y-%m-%d %H:%M") if at else "-"

    def as_dict(self) -> dict:
        r = self.row
        return {
            "id": r.pk,
            "node": r.node_id,
            "path": r.path,
            "source": r.source,
            "size_bytes": r.size_bytes,
            "shared": r.shared,
            "pinned": r.pinned,
            "last_used_at": r.last_used_at,
            "unused_since": r.unused_since,
            "in_use_by": list(self.used_by),
            "removal": r.removal,
            "kept_reason": r.kept_reason,
        }


def _users(node_ids: set[str] | None) -> list[tuple[str, str, str, str]]:
    """(node, model, shard id, model_path) of shards desired or running."""
    qs = Shard.objects.filter(node__isnull=False).exclude(
        desired_state=DesiredState.STOPPED, state__in=SHARD_FINISHED
    )
    if node_ids is not None:
        qs = qs.filter(node_id__in=node_ids)
    out = []
    for nid, sid, spec in qs.values_list("node_id", "pk", "spec"):
        spec = json.loads(spec) if isinstance(spec, str) else (spec or {})
        path = (spec.get("profile") or {}).get("model_path") or ""
        if path:
            out.append((nid, spec.get("model") or "?", sid, path))
    return out


def annotate(rows) -> list[Item]:
    """What uses each of these rows: a shard on its node, or on any node when shared."""
    rows = list(rows)
    shared = any(r.shared for r in rows)
    users = _users(None if shared else {r.node_id for r in rows})
    by_node: dict[str, list[tuple[str, str, Wanted]]] = {}
    everywhere = []
    for nid, model, sid, path in users:
        entry = (model, sid, Wanted([path]))
        by_node.setdefault(nid, []).append(entry)
        everywhere.append(entry)
    items = []
    for r in rows:
        pool = everywhere if r.shared else by_node.get(r.node_id, [])
        used_by = [f"{m} ({sid})" for m, sid, w in pool if w.serves(r.path, r.source)]
        items.append(Item(r, used_by))
    return items


def listing(node_id: str | None = None, unused: bool = False) -> list[Item]:
    qs = LocalWeights.objects.order_by("node_id", "path")
    if node_id:
        qs = qs.filter(node_id=node_id)
    items = annotate(qs)
    return [i for i in items if i.unused] if unused else items


def set_pinned(ids, pinned: bool) -> int:
    """Pin (never removed) or unpin entries; a shared entry's rows on every node go
    together, as they are one copy. Returns how many rows changed."""
    rows = LocalWeights.objects.filter(pk__in=list(ids))
    shared = list(rows.filter(shared=True).values_list("path", flat=True))
    touched = rows.exclude(pinned=pinned)
    if shared:
        touched |= LocalWeights.objects.filter(path__in=shared, shared=True).exclude(pinned=pinned)
    with transaction.atomic():
        entries = list(touched.select_for_update())
        changed = LocalWeights.objects.filter(pk__in=[e.pk for e in entries]).update(pinned=pinned)
        for entry in entries:
            audit.record(entry, {"pinned": (not pinned, pinned)})
    return changed


def request_removal(ids, wait_s: float = 5.0):
    """Ask for these entries to go now: a pass proposes them if nothing needs them
    and they are not pinned (the node re-checks each). Returns the pass's report.

    The entries are marked under the pass lock, so the answer is this pass's own
    judgement of them: marked before it, beat's pass in another process could
    propose them first and leave this answer empty. When the lock stays held for
    ``wait_s`` nothing is marked and the report says ``skipped``.
    """
    from . import cleanup

    ids = list(ids)

    def mark():
        with transaction.atomic():
            for entry in LocalWeights.objects.filter(pk__in=ids, remove_requested=False):
                audit.record(entry, {"remove_requested": (False, True)})
            LocalWeights.objects.filter(pk__in=ids).update(remove_requested=True, kept_at=None)
            # A shared path is one copy: "kept a moment ago" on another node's row of
            # it would hold the request back like a removal under way.
            shared = LocalWeights.objects.filter(pk__in=ids, shared=True).values("path")
            LocalWeights.objects.filter(shared=True, path__in=shared).update(kept_at=None)

    return cleanup.run_locked(wait_s=wait_s, first=mark)
