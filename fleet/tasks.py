"""Celery tasks: thin, idempotent, take primary keys; the work is in fleet.services."""

from celery import shared_task

from fleet.services.reconciler import runner


@shared_task(ignore_result=True)
def reconcile() -> None:
    """One reconciler pass, unless another is running (beat every 5 s, and after changes)."""
    runner.run_locked()
