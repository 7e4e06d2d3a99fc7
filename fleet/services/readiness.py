"""When a replica is ready: the one rule the reconciler, the gateway, drains and `make run` share.

A replica is ready when every shard of its current placement is ready and
meant to run. Its current placement is the shards not told to stop: a replica
placed again (a restart, or a silent node's replica moved) keeps its old
shards, told to stop, until their agent confirms, and they are not part of
what serves now. A shard told to drain is on its way out and takes no new
requests, so a replica with one is not ready either.

Shards are anything with ``state`` and ``desired_state``: model instances,
the reconciler's raw rows, the gateway's table entries.
"""

from fleet.models import DesiredState, ShardState


def serving_shards(shards) -> list:
    """The shards of a replica's current placement (not told to stop)."""
    return [s for s in shards if s.desired_state != DesiredState.STOPPED]


def replica_ready(shards) -> bool:
    """Whether a replica with these shards serves: some, all ready, all meant to run."""
    current = serving_shards(shards)
    return bool(current) and all(
        s.state == ShardState.READY and s.desired_state == DesiredState.RUNNING for s in current
    )
