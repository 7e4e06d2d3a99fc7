"""What operators read about a model's scaling, in the admin, the API, the CLI and the console."""

from fleet.models import Event, EventKind


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
