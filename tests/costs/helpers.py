"""The cost tests' vocabulary: a fleet of H100 nodes, teams, replicas that hold GPUs, and a
clock that counts."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.contrib.auth.models import Group

from fleet.models import (
    CostHour,
    DesiredState,
    EngineProfile,
    KeyUsage,
    Model,
    Price,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
    Team,
)
from fleet.services import costs
from tests.factories import add_node, inference_key

H100 = "NVIDIA H100 80GB HBM3"  # tests.factories.H100_GPUS
H100_MIB = 81559


def at(h, m=0, s=0, day=7) -> datetime:
    return datetime(2026, 12, day, h, m, s, tzinfo=UTC)


def team(name: str, **fields) -> Team:
    return Team.objects.create(name=name, group=Group.objects.create(name=name), **fields)


def model(name: str, owner: Team | None = None, *, share_gb=None, gpus=1, host_gb=None) -> Model:
    m = Model.objects.create(name=name, desired_replicas=1, team=owner)
    m.active_profile = EngineProfile.objects.create(
        model=m,
        name="default",
        engine="fake",
        model_path=f"/models/{name}",
        gpus_per_node=gpus,
        gpu_memory_gb=share_gb,
        min_memory_gb=host_gb,
    )
    m.save()
    return m


def node(node_id: str, gpus: int = 8, memory_gb: int = 64):
    """A node of ``gpus`` H100s (GPU-<node>-<index>); 0: a CPU-only node."""
    if gpus:
        return add_node(node_id, memory_gb=memory_gb) if gpus == 8 else _some(node_id, gpus)
    return add_node(node_id, gpus=[], memory_gb=memory_gb)


def _some(node_id, n):
    from tests.factories import H100_GPUS

    return add_node(
        node_id, gpus=[{**g, "uuid": f"GPU-{node_id}-{g['index']}"} for g in H100_GPUS[:n]]
    )


def place(m: Model, node_id: str, *indices: int, state=ShardState.READY) -> Shard:
    """A replica of ``m`` whose one shard holds these GPUs of the node."""
    replica = Replica.objects.create(model=m, profile=m.active_profile, state=ReplicaState.READY)
    return Shard.objects.create(
        replica=replica,
        node_id=node_id,
        gpu_uuids=[f"GPU-{node_id}-{i}" for i in indices],
        port=9000,
        state=state,
        desired_state=DesiredState.RUNNING,
    )


def finish(shard: Shard, state=ShardState.STOPPED) -> None:
    Shard.objects.filter(pk=shard.pk).update(state=state)


def price(gpu_class: str, per_hour: str, frm: datetime, currency="USD") -> Price:
    return costs.set_price(gpu_class, Decimal(per_hour), currency, frm)


def served(model_name: str, hour: datetime, tokens: int, key_name="client") -> None:
    key = inference_key(key_name)[0]
    KeyUsage.objects.create(
        key=key,
        model=model_name,
        hour=hour,
        requests=1,
        prompt_tokens=tokens // 2,
        completion_tokens=tokens - tokens // 2,
    )


def tick(start: datetime, end: datetime, every=timedelta(minutes=1), at_each=None) -> None:
    """Counts from ``start`` to ``end`` (both included) every ``every``; ``at_each(t)``
    after each count changes the fleet, as if it changed right after."""
    t = start
    while t <= end:
        costs.accrue(t)
        if at_each is not None:
            at_each(t)
        t += every


def fleet_cost(start: datetime, end: datetime) -> tuple[float, Decimal]:
    """All the rows of the period: GPU-hours and cost."""
    rows = CostHour.objects.filter(hour__gte=start, hour__lt=end)
    return (
        sum(r.gpu_seconds for r in rows) / 3600,
        sum((r.cost for r in rows), Decimal(0)),
    )
