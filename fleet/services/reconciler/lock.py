"""The reconciler's lock: one pass at a time across every worker, and notes left for the holder.

The lock is a PostgreSQL advisory lock when the database is PostgreSQL (it dies
with the connection of a worker that dies), else a Redis lock with a short
expiry that a thread of the holder renews while the pass runs (the embedded
SQLite setup): a worker killed -9 mid-pass stops renewing it, so passes resume
within LOCK_TTL_S, while a long pass never loses the lock to the next one.

A pass that finds the lock held leaves a note ("again") in Redis, and the
holder runs once more when it sees it (``runner.run_locked``), so a change
made while a pass was reading is never left for the next beat.
"""

import logging
import threading
from contextlib import contextmanager

import redis
from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)

ADVISORY_LOCK_ID = 0x6C6C6D67  # "llmg"
# How long a dead holder's Redis lock stops passes; renewed every third of it.
LOCK_TTL_S = 10
# How long a note ("again") waits for a holder to see it.
NOTE_TTL_S = 60

_client: redis.Redis | None = None


def redis_client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=1
        )
    return _client


def prefix() -> str:
    # The channel-layer prefix keeps separate installations (and test runs)
    # sharing one Redis apart; it also names their Celery queue (settings).
    return settings.CHANNEL_LAYERS["default"]["CONFIG"].get("prefix", "llmgw")


def key(name: str) -> str:
    return f"{prefix()}:reconcile:{name}"


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
    with redis_pass_lock() as got:
        yield got


@contextmanager
def redis_pass_lock():
    """The lock on the embedded setup: a Redis key with a short expiry, renewed while held."""
    # thread_local=False: the renewing thread must see the token the pass took.
    lock = redis_client().lock(key("lock"), timeout=LOCK_TTL_S, thread_local=False)
    got = lock.acquire(blocking=False)
    stop = threading.Event()
    renewer = None
    if got:
        renewer = threading.Thread(
            target=_renew, args=(lock, stop), name="reconcile-lock", daemon=True
        )
        renewer.start()
    try:
        yield got
    finally:
        if got:
            stop.set()
            renewer.join()
            try:
                lock.release()
            except redis.exceptions.LockError:
                logger.warning("the reconciler lock expired during a pass")


def _renew(lock, stop: threading.Event) -> None:
    """Keep the holder's Redis lock alive until the pass ends (or the process dies)."""
    while not stop.wait(LOCK_TTL_S / 3):
        try:
            lock.reacquire()
        except redis.exceptions.LockError:
            logger.warning("the reconciler lock was lost during a pass")
            return
        except redis.RedisError:
            # Redis is away: the pass will fail on its own; try again next tick.
            logger.warning("could not renew the reconciler lock", exc_info=True)


def note_again() -> None:
    try:
        redis_client().set(key("again"), 1, ex=NOTE_TTL_S)
    except redis.RedisError:
        pass  # the next beat covers it


def take_again() -> bool:
    try:
        return bool(redis_client().getdel(key("again")))
    except redis.RedisError:
        return False
