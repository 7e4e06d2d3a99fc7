"""Celery tasks: thin, idempotent, take primary keys; the work is in fleet.services."""

from celery import shared_task

from fleet.services.reconciler import runner


@shared_task(ignore_result=True)
def reconcile() -> None:
    """One reconciler pass, unless another is running (beat every 5 s, and after changes)."""
    runner.run_locked()


@shared_task(ignore_result=True)
def gc_weights() -> None:
    """One weights clean-up pass, unless a reconciler pass holds the lock (beat every 60 s)."""
    from fleet.services.weights_gc import cleanup

    cleanup.run_locked()


@shared_task(ignore_result=True)
def audit_retention() -> None:
    """Remove audit entries older than LLMGW_AUDIT_RETENTION_DAYS (beat, hourly)."""
    from fleet import audit

    audit.expire()


@shared_task(ignore_result=True)
def estimate_profiles() -> None:
    """Estimate what new or changed profiles' models need, from their weights' headers."""
    from fleet.services import estimate

    estimate.refresh_profiles()


@shared_task(ignore_result=True)
def batches_tick() -> None:
    """Check new batches and hand each owner's batches to a worker (beat, every 2 s)."""
    from fleet.services.batches import runner

    for owner in runner.tick():
        run_batches.delay(owner)


@shared_task(ignore_result=True)
def run_batches(owner: str) -> None:
    """One slice of an owner's batches, unless another worker holds them; again at once
    when it stopped with lines still to send."""
    from fleet.services.batches import runner

    if runner.run_owner(owner):
        run_batches.delay(owner)


@shared_task(ignore_result=True)
def accrue_costs() -> None:
    """Count what each replica holds into the hour's costs; close past hours; bring the
    teams' spending up to date (beat, every LLMGW_COST_INTERVAL_S)."""
    from fleet.services import costs

    costs.accrue()
