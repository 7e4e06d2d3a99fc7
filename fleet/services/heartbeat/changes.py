"""Facts a node states afresh, and the log lines their changes are worth.

Registration and heartbeats both replace a node's storage, weights and engine
installs and both notice memory and engine changes, so both call these: one
wording for each change in the log, one way to replace each kind of row.
"""

import logging
from datetime import UTC, datetime

from fleet.models import EngineInstall, LocalWeights, Node, Storage

logger = logging.getLogger(__name__)

_FAILED_INSTALL = {"failed", "unsupported"}


def _log_install_changes(node_id: str, before: dict, installs: list) -> None:
    # A state change is worth a line; a download's progress is not.
    for e in installs:
        if before.get(e.engine) != e.state:
            level = logging.WARNING if e.state in _FAILED_INSTALL else logging.INFO
            logger.log(
                level,
                "engine installation node=%s engine=%s version=%s variant=%s state=%s detail=%s",
                node_id,
                e.engine,
                e.version,
                e.variant,
                e.state,
                e.detail,
            )


def replace_installs(node: Node, installs: list) -> None:
    before = dict(node.engine_installs.values_list("engine", "state"))
    _log_install_changes(node.pk, before, installs)
    node.engine_installs.all().delete()
    EngineInstall.objects.bulk_create(EngineInstall(node=node, **e.model_dump()) for e in installs)


def replace_storage(node_ids_and_lists) -> None:
    node_ids = [n for n, _ in node_ids_and_lists]
    Storage.objects.filter(node_id__in=node_ids).delete()
    Storage.objects.bulk_create(
        Storage(node_id=n, **s.model_dump()) for n, lst in node_ids_and_lists for s in lst
    )


_REPORTED = ("size_bytes", "shared", "source", "last_used_at")


def replace_weights(node: Node, weights: list) -> None:
    """The node's weights as it reports them, updated in place by path.

    What the control plane keeps about an entry (a pin, since when it is
    unused, a removal under way) lives on the same row, so it survives the
    report; an entry no longer reported is gone from the disk, and its row with it.
    """
    replace_weights_of([(node.pk, weights)])


def replace_weights_of(node_ids_and_lists) -> None:
    """``replace_weights`` for many nodes at once, as (node id, weights) pairs: one read,
    and at most one delete, update and insert for them all."""
    reported: dict[str, dict[str, dict]] = {}
    for node_id, weights in node_ids_and_lists:
        mine = reported.setdefault(node_id, {})
        for w in weights:  # the last of a path reported twice wins
            last_used = w.last_used
            mine[w.path] = {
                "size_bytes": w.size_bytes,
                "shared": w.shared,
                "source": w.source,
                "last_used_at": (
                    None if last_used is None else datetime.fromtimestamp(last_used, tz=UTC)
                ),
            }
    existing: dict[str, dict[str, LocalWeights]] = {}
    for row in LocalWeights.objects.filter(node_id__in=list(reported)):
        existing.setdefault(row.node_id, {})[row.path] = row
    gone, changed, new = [], [], []
    for node_id, mine in reported.items():
        rows = existing.get(node_id, {})
        gone += [row.pk for path, row in rows.items() if path not in mine]
        for path, facts in mine.items():
            row = rows.get(path)
            if row is None:
                new.append(LocalWeights(node_id=node_id, path=path, **facts))
            elif any(getattr(row, f) != facts[f] for f in _REPORTED):
                for f in _REPORTED:
                    setattr(row, f, facts[f])
                changed.append(row)
    if gone:
        LocalWeights.objects.filter(pk__in=gone).delete()
    if changed:
        LocalWeights.objects.bulk_update(changed, _REPORTED)
    if new:
        LocalWeights.objects.bulk_create(new)


def memory_changed(node_id: str, before_mb: int | None, now_mb: int | None) -> bool:
    """Log a change of a node's memory; returns whether it changed."""
    if before_mb == now_mb:
        return False
    logger.info("node memory changed node=%s from_mb=%s to_mb=%s", node_id, before_mb, now_mb)
    return True


def engines_changed(node_id: str, before: dict, now: dict) -> bool:
    """Log a change of a node's engine versions; returns whether they changed."""
    if before == now:
        return False
    logger.info("node engines changed node=%s from=%s to=%s", node_id, sorted(before), sorted(now))
    return True
