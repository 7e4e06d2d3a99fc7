"""Asking for a reconciler pass soon, from anywhere, without importing the pass.

A request thread, a socket's database thread or a signal handler asks; a
Celery worker runs the pass. The task is sent by name, so asking imports
neither the pass nor ``fleet.tasks`` (which imports the runner): the services
that ask (inventory, drains, node operations) stay below the reconciler.
"""

import logging
import time

from celery import current_app
from django.db import transaction

from fleet.conf import fleet_settings

from . import lock

logger = logging.getLogger(__name__)

TASK = "fleet.tasks.reconcile"
# Kicks within this window share one queued pass.
KICK_COALESCE_MS = 1000


def request_reconcile() -> None:
    """Ask for a pass soon after the current transaction commits."""
    transaction.on_commit(request_reconcile_now)


# After Redis fails a kick, kicks are skipped for this long: they run in the
# request and socket threads, which must not wait on a Redis that is down, and
# beat covers what they would have asked for.
KICK_BACKOFF_S = 5.0
_kicks_off_until = 0.0


def request_reconcile_now() -> None:
    """Ask for a pass now, for a caller with nothing to commit first (the gateway's
    load report, in a thread). Never waits on a Redis that failed a moment ago."""
    global _kicks_off_until
    if time.monotonic() < _kicks_off_until:
        return
    if current_app.conf.task_always_eager:
        # No worker to send to (CELERY_TASK_ALWAYS_EAGER): run the task here, as
        # apply_async would. Only then is the runner imported.
        current_app.loader.import_default_modules()
        current_app.tasks[TASK].apply()
        return
    try:
        if not lock.redis_client().set(lock.key("kick"), 1, nx=True, px=KICK_COALESCE_MS):
            return  # a pass is queued already and will see this change
        # No publish retries: a broker that is down must not hold this thread.
        current_app.send_task(
            TASK,
            expires=fleet_settings().reconcile_interval_s,
            queue=lock.prefix(),
            retry=False,
        )
    except Exception:  # noqa: BLE001 - Redis or the broker down: the next beat covers it
        _kicks_off_until = time.monotonic() + KICK_BACKOFF_S
        logger.warning(
            "could not ask for a reconciler pass; the next beat will run one", exc_info=True
        )
