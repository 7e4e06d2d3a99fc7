"""Whom a runner works for, and one worker at a time for each.

Batches are run by owner: a team, or a key of no team (``owner_of``), so an
owner's concurrency bound holds across its batches. Each owner is run by one
worker at a time, under a lease in Redis that a thread renews while it is held:
a worker killed -9 is replaced once its lease runs out, and one whose renewal
fails stops starting lines (``Lease.lost``). This changes with how the work is
shared among workers; what a worker does under the lease is ``runner``'s.
"""

import logging
import threading

import redis
from django.db.models import Q

logger = logging.getLogger(__name__)


def owner_of(team_id: int | None, key_id: int) -> str:
    """The owner a batch is run for: its team, or its key when it has none."""
    return f"team:{team_id}" if team_id is not None else f"key:{key_id}"


def owned_by(owner: str) -> Q:
    """The batches an owner's worker runs."""
    kind, _, pk = owner.partition(":")
    if kind == "team":
        return Q(team_id=int(pk))
    return Q(api_key_id=int(pk), team__isnull=True)


def _lease_key(owner: str) -> str:
    from fleet.services.reconciler.lock import prefix

    return f"{prefix()}:batch:lease:{owner}"


class Lease:
    """An owner's lease in Redis: held by one worker, renewed by a thread of its own while
    held, and ``lost`` when a renewal fails (the worker then stops starting lines)."""

    def __init__(self, owner: str, ttl_s: float):
        from fleet.services.reconciler.lock import redis_client

        self.lock = redis_client().lock(_lease_key(owner), timeout=ttl_s, thread_local=False)
        self.ttl_s = ttl_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> bool:
        self.held = self.lock.acquire(blocking=False)
        if self.held:
            self._thread = threading.Thread(target=self._renew, name="batch-lease", daemon=True)
            self._thread.start()
        return self.held

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.lock.reacquire()
            except (redis.exceptions.LockError, redis.RedisError):
                logger.warning(
                    "batch lease %s lost; this worker stops starting lines", self.lock.name
                )
                self.lost.set()
                return

    def __exit__(self, *exc) -> None:
        if not self.held:
            return
        self._stop.set()
        self._thread.join()
        try:
            self.lock.release()
        except (redis.exceptions.LockError, redis.RedisError):
            pass  # expired or Redis away: it runs out by itself


def lease_held(owner: str) -> bool:
    from fleet.services.reconciler.lock import redis_client

    try:
        return bool(redis_client().exists(_lease_key(owner)))
    except redis.RedisError:
        return False
