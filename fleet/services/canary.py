"""A model's canary (docs/operations.md, "Canaries"): a second profile beside the active
one, with a share of the traffic, promoted or aborted by an operator.

Starting one is setting ``canary_profile`` and ``canary_percent`` (admin, API, a
catalog file); the reconciler runs its replicas (``passes.scale_canary``) and
the gateway splits requests (``fleet.gateway.table``). Promote makes it the
active profile, and the rolling replacement that exists replaces the rest;
abort clears it, and its replicas drain as outdated ones do.
"""

import logging

from django.db import transaction
from django.utils import timezone

from fleet.models import Event, EventKind, Model

from . import permissions
from .reconciler.ask import request_reconcile

logger = logging.getLogger(__name__)


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
    permissions.require_action(actor, "model.canary", f"promote the canary of {model.name}")
    with transaction.atomic():
        m = Model.objects.select_for_update().get(pk=model.pk)
        if m.canary_profile_id is None:
            raise NoCanary(f"model '{m.name}' runs no canary to promote")
        name = m.canary_profile.name
        Model.objects.filter(pk=m.pk).update(
            active_profile=m.canary_profile_id, canary_profile=None, canary_percent=0
        )
        text = f"canary '{name}' promoted by {permissions.name_of(actor)}" + (
            f": {why}" if why else ""
        )
        _event(m, text + "; the other replicas are replaced one at a time")
    return text


def abort(model: Model, actor, why: str = "") -> str:
    """The canary is dropped; its replicas drain and stop."""
    permissions.require_action(actor, "model.canary", f"abort the canary of {model.name}")
    with transaction.atomic():
        m = Model.objects.select_for_update().get(pk=model.pk)
        if m.canary_profile_id is None:
            raise NoCanary(f"model '{m.name}' runs no canary to abort")
        name = m.canary_profile.name
        Model.objects.filter(pk=m.pk).update(canary_profile=None, canary_percent=0)
        text = f"canary '{name}' aborted by {permissions.name_of(actor)}" + (
            f": {why}" if why else ""
        )
        _event(m, text + "; its replicas drain")
    return text
