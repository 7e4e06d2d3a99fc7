"""What operators read about a model's scaling, in the admin, the API and the CLI."""


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
