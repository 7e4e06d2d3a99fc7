"""Running reconciler passes under the lock, once more for every request that came meanwhile.

This is what the Celery task ``fleet.tasks.reconcile`` calls, on beat every
5 s and after each ask (``ask.request_reconcile``).
"""

import logging

import redis

from . import lock, passes

logger = logging.getLogger(__name__)

MAX_RERUNS = 3


def run_locked(now=None) -> passes.PassReport | None:
    """Run a pass if no other is running (and again if asked meanwhile); None if skipped.

    A request must never fall between two passes: one that finds the lock held
    leaves a note and tries the lock once more, and the holder looks for notes
    after each pass and again after releasing the lock, so whichever of them
    comes last runs the pass.
    """
    try:
        lock.redis_client().delete(lock.key("kick"))
    except redis.RedisError:
        pass  # only the coalescing of kicks is lost
    report = None
    for attempt in range(MAX_RERUNS + 1):
        with lock.pass_lock() as got:
            if not got:
                if attempt:
                    return report  # whoever holds it now started after our note
                lock.note_again()
                with lock.pass_lock() as got_now:
                    if not got_now:
                        logger.debug("reconciler pass left to the one running")
                        return None
                    lock.take_again()
                    report = _passes(now)
            else:
                report = _passes(now)
        if not lock.take_again():
            return report
    return report


def _passes(now) -> passes.PassReport:
    report = passes.run_pass(now)
    for _ in range(MAX_RERUNS - 1):
        if not lock.take_again():
            break
        report = passes.run_pass(now)
    return report
