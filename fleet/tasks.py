"""Celery tasks: thin, idempotent, take primary keys. The reconciler fills these in."""

from celery import shared_task

from fleet.services import dispatch


@shared_task(ignore_result=True)
def ring_node(node_id: str) -> None:
    """Tell a node's socket that its desired set changed."""
    dispatch.notify_node(node_id, "node.doorbell")
