"""Operator actions on nodes."""

import logging

from fleet.models import Node

logger = logging.getLogger(__name__)


def cordon(node: Node) -> bool:
    """No new placements on this node. Returns whether anything changed."""
    changed = bool(Node.objects.filter(pk=node.pk, cordoned=False).update(cordoned=True))
    if changed:
        logger.info("node cordoned node=%s", node.pk)
    return changed


def uncordon(node: Node) -> bool:
    """Placements allowed again; also ends a drain. Returns whether anything changed."""
    changed = bool(
        Node.objects.filter(pk=node.pk)
        .exclude(cordoned=False, draining=False)
        .update(cordoned=False, draining=False)
    )
    if changed:
        logger.info("node uncordoned node=%s", node.pk)
    return changed
