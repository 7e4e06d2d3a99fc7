"""What operators read about a model's scaling, in the admin, the API, the CLI and the console."""

from datetime import datetime

from django.utils.timesince import timesince

from fleet.models import Event, EventKind

from ..units import gb_text


def scaling_status(model, ready: int | None) -> str:
    """ "scaled to zero", "starting for 3 waiting requests", "autoscaled 1-4: 2 wanted", or ""
    for a model without autoscaling. ``ready``: its ready replicas, where known."""
    waiting = model.waiting_requests or 0
    if waiting and not ready:
        noun = "request" if waiting == 1 else "requests"
        return f"starting for {waiting} waiting {noun}"
    if not model.autoscaled:
        return ""
    if model.desired_replicas == 0 and not ready:
        return "scaled to zero"
    return f"autoscaled {model.min_replicas}-{model.max_replicas}: {model.desired_replicas} wanted"


def last_decision(model):
    """The autoscaler's last decision for ``model`` (an ``Event`` with its reason), or None:
    the newest of what the admin's Events and ``GET /api/v1/events/?model=ID`` list."""
    return Event.objects.filter(model=model, kind=EventKind.AUTOSCALE).first()


def sleep_policy(model) -> str:
    """A model's sleep (docs/operations.md, "Sleep and wake") in a few words: "after 300 s
    idle, level 1", with ", to zero after 3600 s asleep" when it stops; "" when it never
    sleeps."""
    if model.sleep_after_s is None:
        return ""
    text = f"after {model.sleep_after_s} s idle, level {model.sleep_level}"
    if model.stop_after_asleep_s is not None:
        text += f", to zero after {model.stop_after_asleep_s} s asleep"
    return text


def sleep_status(model, asleep: int | None) -> str:
    """What the API's ``sleep``, the admin and ``llmgw models`` say: "2 asleep; after 300 s
    idle, level 1", the policy alone when none is asleep, "2 asleep; sleep is off: they
    wake" when it was turned off, "" for a model that never sleeps. ``asleep``: its asleep
    replicas, where known."""
    policy = sleep_policy(model) or ("sleep is off: they wake" if asleep else "")
    return f"{asleep} asleep; {policy}" if asleep else policy


def asleep_text(since: datetime | None, host_mb: int | None, now: datetime) -> str:
    """A sleeping replica or shard for people: "asleep 4 minutes · holds 16 GB of host
    memory" (``fleet.services.snapshot.asleep_host_mb``, summed over its shards), "holds no
    host memory" where its weights were dropped, and "going to sleep" while no shard of it
    sleeps yet (``host_mb`` None: its requests in flight finish first)."""
    if host_mb is None:
        return "going to sleep"
    held = f"holds {gb_text(host_mb)} GB of host memory" if host_mb else "holds no host memory"
    if since is None:
        return f"asleep · {held}"
    return f"asleep {timesince(since, now, depth=1)} · {held}"
