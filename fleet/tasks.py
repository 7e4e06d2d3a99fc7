"""Celery tasks: thin, idempotent, take primary keys; the work is in fleet.services."""

from celery import shared_task

from fleet.services import dispatch, reconcile_lock


@shared_task(ignore_result=True)
def ring_node(node_id: str) -> None:
    """Tell a node's socket that its desired set changed."""
    dispatch.notify_node(node_id, "node.doorbell")


@shared_task(ignore_result=True)
def reconcile() -> None:
    """One reconciler pass, unless another is running (beat every 5 s, and after changes)."""
    reconcile_lock.run_locked()
