"""Running reconciler passes: one at a time across every worker, and soon after a change.

The lock is a PostgreSQL advisory lock when the database is PostgreSQL (it dies
with the connection of a worker that dies), else a Redis lock with an expiry
(the embedded SQLite setup). A pass that finds the lock held leaves a note, and
the pass holding it runs once more when it is done, so a change made while a
pass was reading is never left for the next beat.
"""

import logging
import time
from contextlib import contextmanager

import redis
from django.conf import settings
from django.db import connection, transaction

from . import reconcile

logger = logging.getLogger(__name__)

ADVISORY_LOCK_ID = 0x6C6C6D67  # "llmg"
# A Redis lock outlives a pass by far; it only matters if a worker dies holding it.
LOCK_TTL_S = 60
# Kicks within this window share one queued pass.
KICK_COALESCE_MS = 1000
MAX_RERUNS = 3

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=1
        )
    return _client


def _prefix() -> str:
    # The channel-layer prefix keeps separate installations (and test runs)
    # sharing one Redis apart; it also names their Celery queue (settings).
    return settings.CHANNEL_LAYERS["default"]["CONFIG"].get("prefix", "llmgw")


def _key(name: str) -> str:
    return f"{_prefix()}:reconcile:{name}"


@contextmanager
def pass_lock():
    """Yields whether this process holds the reconciler lock; never waits for it."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_LOCK_ID])
            got = bool(cur.fetchone()[0])
        try:
            yield got
        finally:
            if got:
                try:
                    with connection.cursor() as cur:
                        cur.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_LOCK_ID])
                except Exception:  # noqa: BLE001 - the connection is gone, and the lock with it
                    logger.warning("could not release the reconciler lock", exc_info=True)
        return
    lock = _redis().lock(_key("lock"), timeout=LOCK_TTL_S)
    got = lock.acquire(blocking=False)
    try:
        yield got
    finally:
        if got:
            try:
                lock.release()
            except redis.exceptions.LockError:
                logger.warning("the reconciler lock expired during a pass")


def _note_again() -> None:
    try:
        _redis().set(_key("again"), 1, ex=LOCK_TTL_S)
    except redis.RedisError:
        pass  # the next beat covers it


def _take_again() -> bool:
    try:
        return bool(_redis().getdel(_key("again")))
    except redis.RedisError:
        return False


def run_locked(now=None) -> reconcile.PassReport | None:
    """Run a pass if no other is running (and again if asked meanwhile); None if skipped.

    A request must never fall between two passes: one that finds the lock held
    leaves a note and tries the lock once more, and the holder looks for notes
    after each pass and again after releasing the lock, so whichever of them
    comes last runs the pass.
    """
    try:
        _redis().delete(_key("kick"))
    except redis.RedisError:
        pass  # only the coalescing of kicks is lost
    report = None
    for attempt in range(MAX_RERUNS + 1):
        with pass_lock() as got:
            if not got:
                if attempt:
                    return report  # whoever holds it now started after our note
                _note_again()
                with pass_lock() as got_now:
                    if not got_now:
                        logger.debug("reconciler pass left to the one running")
                        return None
                    _take_again()
                    report = _passes(now)
            else:
                report = _passes(now)
        if not _take_again():
            return report
    return report


def _passes(now) -> reconcile.PassReport:
    report = reconcile.run_pass(now)
    for _ in range(MAX_RERUNS - 1):
        if not _take_again():
            break
        report = reconcile.run_pass(now)
    return report


def request_reconcile() -> None:
    """Ask for a pass soon after the current transaction commits."""
    transaction.on_commit(_kick)


# After Redis fails a kick, kicks are skipped for this long: they run in the
# request and socket threads, which must not wait on a Redis that is down, and
# beat covers what they would have asked for.
KICK_BACKOFF_S = 5.0
_kicks_off_until = 0.0


def _kick() -> None:
    global _kicks_off_until
    if time.monotonic() < _kicks_off_until:
        return
    try:
        if not _redis().set(_key("kick"), 1, nx=True, px=KICK_COALESCE_MS):
            return  # a pass is queued already and will see this change
        from fleet.tasks import reconcile as task

        # No publish retries: a broker that is down must not hold this thread.
        task.apply_async(
            expires=settings.LLMGW["RECONCILE_INTERVAL_S"], queue=_prefix(), retry=False
        )
    except Exception:  # noqa: BLE001 - Redis or the broker down: the next beat covers it
        _kicks_off_until = time.monotonic() + KICK_BACKOFF_S
        logger.warning(
            "could not ask for a reconciler pass; the next beat will run one", exc_info=True
        )
