"""The reconciler: the catalog's desired replicas against the shards that exist.

Exports ``request_reconcile`` (ask for a pass soon, after commit), ``run_locked``
(what the Celery task runs), ``run_pass`` (one pass, for tests and the
benchmark), ``PassReport`` and ``backoff_s``. They are loaded on first use, so
that importing this package to ask for a pass loads neither the pass nor
``fleet.tasks``.

The modules, in the order a pass meets them:

- ``ask``: ``request_reconcile()`` sends the task by name, coalescing kicks.
- ``runner``: ``run_locked()`` runs passes under the lock, again when asked meanwhile.
- ``lock``: the lock itself (advisory lock on PostgreSQL, Redis lock otherwise).
- ``passes``: one pass in one transaction; ``expiry`` (suspect and lost nodes,
  the fleet-wide brake), ``rows`` (the raw reads), ``scaling`` (how many
  replicas of which profile, rolling replacement, canaries), ``placing``
  (placement's decisions turned into shards), ``housekeeping`` (finished drains,
  registrations, forgetting rows) and ``report`` (what the pass did).
- ``metrics``: the reconciler's figures on /metrics, read from FleetStatus.

Adding a rule to the pass: read what it needs in ``_Pass.load`` (or ``rows``
when it must be fast at 5,000 nodes), decide in a method of ``_Pass`` or a
mixin beside ``placing``, write through ``set_replica``/``set_shards`` so the
writes are batched, count it in ``PassReport``, and test it in
tests/reconciler with ``now`` passed in.
"""

_EXPORTS = {
    "request_reconcile": "ask",
    "run_locked": "runner",
    "run_pass": "passes",
    "backoff_s": "passes",
    "PassReport": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
