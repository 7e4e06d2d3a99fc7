"""When a batch line may start: interactive requests come first.

A line for a model waits while that model's interactive requests are waiting
at the gateways, for a replica or in a fair queue for room on a busy one (their
load reports to Redis, ``fleet.services.autoscaler.load``), or while the model
has no ready replica: a batch takes what interactive traffic leaves and never
wakes a model up or scales it by itself. The gateway holds the same line per
request (``fleet.gateway.fair.batch_refusal``); this pause spares it the
refusals. A LoRA adapter's lines follow its base model. Pure: the facts come
in, the reason (or "") goes out.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Facts:
    ready: frozenset[str] = frozenset()  # models with a ready replica
    waiting: dict[str, int] = field(default_factory=dict)  # interactive requests waiting, by model
    base_of: dict[str, str] = field(default_factory=dict)  # adapter -> its base model


def why_paused(model: str, facts: Facts) -> str:
    """Why a line for ``model`` may not start now; "" when it may."""
    served = facts.base_of.get(model, model)
    waiting = facts.waiting.get(served, 0)
    if waiting > 0:
        return f"{waiting} interactive request(s) wait for model '{served}'"
    if served not in facts.ready:
        return f"model '{served}' has no ready replica"
    return ""


def gather() -> Facts:
    """The facts now: ready replicas and adapters from the database, waiting from Redis
    (when Redis does not answer, nothing is known to wait)."""
    import redis

    from fleet.models import Adapter, Replica, ReplicaState
    from fleet.services.autoscaler import load

    ready = frozenset(
        Replica.objects.filter(state=ReplicaState.READY)
        .values_list("model__name", flat=True)
        .distinct()
    )
    base_of = dict(Adapter.objects.values_list("name", "model__name"))
    try:
        waiting = {m: f.waiting + f.queued for m, f in load.read().items() if f.waiting or f.queued}
    except redis.RedisError:
        waiting = {}
    return Facts(ready=ready, waiting=waiting, base_of=base_of)
