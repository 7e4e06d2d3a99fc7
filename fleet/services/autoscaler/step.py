"""The autoscaler's part of a reconciler pass: read the gateways' load, decide, record.

Runs inside the pass's transaction, before the pass scales (``passes._Pass.run``):
a changed ``desired_replicas`` is written with a conditional update and acted
on by the same pass. Each decision is an ``Event`` with its reason. The
gateways' figures kept on the model (last request, waiting) are written only
when they change.
"""

import logging
from datetime import datetime, timedelta

import redis

from fleet.conf import fleet_settings
from fleet.models import Event, EventKind, Model, Replica, ReplicaState

from . import load as load_reports
from .decide import Decision, Facts, Policy, decide

logger = logging.getLogger(__name__)

_redis_down = False
EVENTS_KEPT_DAYS = 30


def policy_for(model: Model) -> Policy:
    c = fleet_settings()
    return Policy(
        min_replicas=model.min_replicas,
        max_replicas=model.max_replicas,
        target=model.target_outstanding or c.autoscale_target_outstanding,
        idle_s=model.scale_to_zero_after_s,
        sleep_s=model.sleep_after_s,
        stop_asleep_s=model.stop_after_asleep_s,
        hysteresis=c.autoscale_hysteresis,
        up_cooldown_s=c.autoscale_up_cooldown_s,
        down_cooldown_s=c.autoscale_down_cooldown_s,
    )


def read_loads(now: datetime) -> dict[str, load_reports.ModelLoad] | None:
    """Every gateway's load by model name; None when Redis does not answer (logged once)."""
    global _redis_down
    try:
        loads = load_reports.read(now.timestamp())
    except redis.RedisError as exc:
        if not _redis_down:
            logger.warning("autoscaler: cannot read the gateways' load (%s); holding still", exc)
        _redis_down = True
        return None
    if _redis_down:
        logger.info("autoscaler: reads the gateways' load again")
    _redis_down = False
    return loads


def _seconds(now: datetime, *times) -> float | None:
    known = [t for t in times if t is not None]
    return (now - max(known)).total_seconds() if known else None


def needs_load(model: Model) -> bool:
    """Whether a pass reads the gateways' load for this model: autoscaled, or it sleeps."""
    return model.autoscaled or model.sleep_after_s is not None


_UNREAD = object()


def step(models, by_model: dict[int, list[Replica]], now: datetime, loads=_UNREAD) -> int:
    """Decide for every model; set ``desired_replicas`` on those that change. Returns how many.

    ``loads``: the gateways' load as the pass read it (``read_loads``); read here if not
    given. The figures kept on the model (last request, waiting) are kept for models
    that sleep too."""
    models = [m for m in models if needs_load(m)]
    if not models:
        return 0  # a fleet without autoscaling pays nothing, not even a Redis read
    if loads is _UNREAD:
        loads = read_loads(now)
    known = loads is not None
    decided = 0
    for model in models:
        figures = (loads or {}).get(model.name) or load_reports.ModelLoad()
        if known:
            _keep_figures(model, figures, now)
        if not model.autoscaled:
            continue
        policy = policy_for(model)
        if not known and policy.min_replicas <= model.desired_replicas <= policy.max_replicas:
            continue  # without the gateways' figures only the bounds are kept
        ready = sum(1 for r in by_model.get(model.pk, []) if r.state == ReplicaState.READY)
        facts = Facts(
            desired=model.desired_replicas,
            ready=ready,
            outstanding=figures.outstanding,
            waiting=figures.waiting,
            idle_s=_seconds(now, model.last_request_at, model.last_scaled_at, model.updated_at),
            since_scaled_s=_seconds(now, model.last_scaled_at),
        )
        decision = decide(policy, facts)
        if decision.changed and _record(model, decision, now):
            decided += 1
    return decided


def _keep_figures(model: Model, figures: load_reports.ModelLoad, now: datetime) -> None:
    fields = {}
    if figures.last_request is not None:
        seen = min(now, datetime.fromtimestamp(figures.last_request, tz=now.tzinfo))
        if model.last_request_at is None or seen - model.last_request_at >= timedelta(seconds=1):
            fields["last_request_at"] = seen
    if figures.waiting != model.waiting_requests:
        fields["waiting_requests"] = figures.waiting
    if fields:
        Model.objects.filter(pk=model.pk).update(**fields)
        for k, v in fields.items():
            setattr(model, k, v)


def _record(model: Model, decision: Decision, now: datetime) -> bool:
    before = model.desired_replicas
    # Conditional: an operator's edit since this pass read the model wins.
    if not Model.objects.filter(pk=model.pk, desired_replicas=before).update(
        desired_replicas=decision.desired, last_scaled_at=now
    ):
        return False
    model.desired_replicas = decision.desired
    model.last_scaled_at = now
    # Kept for a while, not for ever: forgotten as new ones are written.
    Event.objects.filter(created_at__lt=now - timedelta(days=EVENTS_KEPT_DAYS)).delete()
    Event.objects.create(
        created_at=now,
        kind=EventKind.AUTOSCALE,
        model=model,
        model_name=model.name,
        direction=decision.direction,
        from_replicas=before,
        to_replicas=decision.desired,
        reason=decision.reason,
    )
    logger.info(
        "autoscaler model=%s replicas=%d->%d direction=%s: %s",
        model.name,
        before,
        decision.desired,
        decision.direction,
        decision.reason,
    )
    return True
