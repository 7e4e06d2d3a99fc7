"""A model's canary (docs/operations.md, "Canaries"): a second profile beside the active
one, with a share of the traffic, promoted or aborted by an operator.

Starting one is setting ``canary_profile`` and ``canary_percent`` (admin, API, a
catalog file); the reconciler runs its replicas (``reconciler.scaling``) and
the gateway splits requests (``fleet.gateway.table``). Promote makes it the
active profile, and the rolling replacement that exists replaces the rest;
abort clears it, and its replicas drain as outdated ones do.
"""

import logging

from django.db import transaction
from django.utils import timezone

from fleet import audit
from fleet.models import Event, EventKind, Model

from . import permissions
from .canary_figures import Tally
from .reconciler.ask import request_reconcile

logger = logging.getLogger(__name__)


# A canary replica that failed this many starts in a row never becomes ready.
NEVER_READY_FAILURES = 3


class NoCanary(ValueError):
    """The model runs no canary: nothing to promote or abort."""


def _event(model: Model, text: str) -> None:
    Event.objects.create(
        created_at=timezone.now(),
        kind=EventKind.CANARY,
        model=model,
        model_name=model.name,
        reason=text,
    )
    logger.info("canary model=%s %s", model.name, text)
    transaction.on_commit(request_reconcile)


def promote(model: Model, actor, why: str = "") -> str:
    """The canary becomes the active profile; its replicas stay, the others are replaced."""
    return _end(model, actor, why, "promote", "the other replicas are replaced one at a time")


def abort(model: Model, actor, why: str = "") -> str:
    """The canary is dropped; its replicas drain and stop."""
    return _end(model, actor, why, "abort", "its replicas drain")


def _end(model: Model, actor, why: str, verb: str, next_: str) -> str:
    permissions.require_action(
        actor, "model.canary", f"{verb} the canary of {model.name}", on=model
    )
    with transaction.atomic():
        m = Model.objects.select_for_update().get(pk=model.pk)
        if m.canary_profile_id is None:
            raise NoCanary(f"model '{m.name}' runs no canary to {verb}")
        name = m.canary_profile.name
        active = m.canary_profile_id if verb == "promote" else m.active_profile_id
        Model.objects.filter(pk=m.pk).update(
            active_profile=active, canary_profile=None, canary_percent=0, canary_started_at=None
        )
        audit.record(
            m,
            {
                "active_profile": (m.active_profile_id, active),
                "canary_profile": (m.canary_profile_id, None),
                "canary_percent": (m.canary_percent, 0),
            },
        )
        done = {"promote": "promoted", "abort": "aborted"}[verb]
        text = f"canary '{name}' {done} by {permissions.name_of(actor)}"
        text += f": {why}" if why else ""
        _event(m, f"{text}; {next_}")
    return text


def judge(
    model: Model, figures: dict, canary_ready: bool, failures: int, now
) -> tuple[str, str] | None:
    """("abort" or "promote", why with the figures against the bounds), or None: keep
    watching. ``figures``: {profile name: Tally} from every gateway (canary_figures);
    ``failures``: the canary replicas' failed starts in a row, the most of any."""
    window = model.canary_window_s
    age = (now - (model.canary_started_at or now)).total_seconds()
    if not canary_ready and (failures >= NEVER_READY_FAILURES or age >= window):
        how = (
            f"failed {failures} starts in a row"
            if failures >= NEVER_READY_FAILURES
            else (f"not within its window of {window} s")
        )
        return "abort", f"its replica never became ready ({how})"
    c = figures.get(model.canary_profile.name) or Tally()
    a = figures.get(model.active_profile.name) if model.active_profile_id else None
    a = a or Tally()
    if c.requests < model.canary_min_requests:
        return None
    said = (
        f"error rate {c.error_rate:.1%} over {c.requests} answers (active profile "
        f"{a.error_rate:.1%} over {a.requests})"
    )
    bound = model.canary_max_error_rate
    if bound is not None and c.error_rate > bound:
        return "abort", f"{said}, past its bound of {bound:.1%}"
    ratio, c95, a95 = model.canary_max_ttft_ratio, c.p95_ttft(), a.p95_ttft()
    if ratio is not None and c95 is not None and a95 is not None:
        said += f"; p95 time to first token ≤ {c95:g} s (active ≤ {a95:g} s)"
        if c95 > ratio * a95:
            return "abort", f"{said}, past its bound of {ratio:g}× the active profile's"
    if model.canary_auto_promote and age >= window:
        return "promote", f"within its bounds for its window of {window} s: {said}"
    return None
