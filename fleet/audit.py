"""The audit trail: every change to what operators own, who made it and through which door.

django-auditlog writes the entries (``auditlog.LogEntry``, append-only): each
save and delete of a model registered in ``register`` becomes one entry with
the before and after of every changed field, secrets left out. A service that
changes rows with a single UPDATE (cordon, revoke, promote …) calls ``record``
with what it changed. This module says who, from where, through which door:

- a web request (admin, console, API): ``AuditMiddleware`` opens a scope; the
  API's bearer key names its user once DRF has checked it (``act_as``);
- a management command: ``manage.py`` opens a scope for the command, with the
  shell's user, and ``--as USER`` names the user (``permissions.actor_named``);
- no scope: the system itself (the reconciler, the autoscaler, Celery).

Importable before Django is set up (manage.py opens its scope first).
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import logging
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta

logger = logging.getLogger(__name__)

SYSTEM_DOOR = "system"


@dataclass
class Scope:
    door: str  # admin, console, api, llmgw, manage.py <command>
    user: object = None  # the Django user acting, once known
    remote_addr: str | None = None
    detail: dict = field(default_factory=dict)  # request, client, os_user, key …


_scope: ContextVar[Scope | None] = ContextVar("llmgw_audit_scope", default=None)


@contextlib.contextmanager
def acting(door: str, user=None, remote_addr: str | None = None, **detail):
    """Changes made inside are recorded as made through ``door`` by ``user``."""
    token = _scope.set(Scope(door, user, remote_addr, detail))
    try:
        yield _scope.get()
    finally:
        _scope.reset(token)


def act_as(user) -> None:
    """The user a door learns of after its scope opened: an API key's, a command's --as."""
    scope = _scope.get()
    if scope is not None and getattr(user, "is_authenticated", False):
        scope.user = user


def command_scope(argv: list[str]):
    """manage.py's scope: the command's name and the shell's user."""
    name = argv[1] if len(argv) > 1 else "help"
    try:
        who = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        who = "?"
    return acting(f"manage.py {name}", os_user=who)


# ---- writing ------------------------------------------------------------------------------


def record(instance, changes: dict, action: str = "update") -> None:
    """An entry for a change made with an UPDATE (no save, so no signal): ``changes`` is
    {field: (before, after)}. Nothing is recorded when nothing changed."""
    from auditlog.models import LogEntry
    from django.utils.encoding import smart_str

    said = {
        name: [None if a is None else smart_str(a), None if b is None else smart_str(b)]
        for name, (a, b) in changes.items()
        if a != b
    }
    if said:
        kind = {"create": LogEntry.Action.CREATE, "delete": LogEntry.Action.DELETE}
        LogEntry.objects.log_create(
            instance, action=kind.get(action, LogEntry.Action.UPDATE), changes=said
        )


def expire(now=None, batch: int = 5000) -> int:
    """Remove entries older than the retention (``audit_retention_days``); returns how many.

    The only removal there is: in batches, so a first run over years of entries
    holds no long lock."""
    from auditlog.models import LogEntry
    from django.utils import timezone

    from fleet.conf import fleet_settings

    days = fleet_settings().audit_retention_days
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    removed = 0
    while True:
        ids = list(
            LogEntry.objects.filter(timestamp__lt=cutoff).values_list("pk", flat=True)[:batch]
        )
        if not ids:
            break
        removed += LogEntry.objects.filter(pk__in=ids).delete()[0]
    if removed:
        logger.info("audit entries older than %d days removed: %d", days, removed)
    return removed


def stamp(sender, instance, **kwargs) -> None:
    """pre_save of every LogEntry: who, from where, through which door."""
    if not instance._state.adding:
        raise PermissionError("the audit trail is append-only: an entry is never changed")
    scope = _scope.get()
    data = dict(instance.additional_data or {})
    if scope is None:
        data.setdefault("door", SYSTEM_DOOR)
    else:
        if instance.actor_id is None and scope.user is not None:
            instance.actor = scope.user
            instance.actor_email = getattr(scope.user, "email", None) or None
        if scope.remote_addr and not instance.remote_addr:
            instance.remote_addr = scope.remote_addr
        data.setdefault("door", scope.door)
        for key, value in scope.detail.items():
            data.setdefault(key, value)
    instance.additional_data = data


def log_line(sender, instance, created, **kwargs) -> None:
    """Each entry as a log line too, for operators who ship logs off the machine."""
    if created:
        logger.info(
            "audit %s %s %s by=%s door=%s changes=%s",
            instance.get_action_display(),
            instance.content_type.model,
            instance.object_pk,
            instance.actor.get_username() if instance.actor_id else "-",
            (instance.additional_data or {}).get("door", "-"),
            list((instance.changes_dict or {}).keys()),
        )


# ---- what is audited ----------------------------------------------------------------------

# Fields of a node that operators set; the rest is what its agent reports.
NODE_FIELDS = ["operator_labels", "cordoned", "draining", "vllm_build", "mgmt_interface"]
SECRETS = ["secret_hash", "previous_secret_hash", "last_used_at"]
# Columns the system keeps up on its own (timestamps, counters, estimates): not a change.
KEPT_UP = [
    "created_at",
    "updated_at",
    "last_request_at",
    "waiting_requests",
    "last_scaled_at",
    "canary_started_at",
    "estimate",
    "args_env_changed_by",
    "args_env_changed_at",
    # A team's spending, kept up by the cost accrual.
    "spent_this_month",
    "spent_updated_at",
    "spent_closed",
    "spent_closed_key",
    "budget_warned_at",
    "budget_spent_at",
]


def register() -> None:
    from auditlog.models import LogEntry
    from auditlog.registry import auditlog
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.db.models.signals import post_save, pre_save

    from fleet.models import (
        Adapter,
        ApiKey,
        EngineProfile,
        JoinToken,
        Model,
        Node,
        NodeCredential,
        Price,
        Team,
        WantedEngine,
    )

    def fields(model, leave_out=()) -> list[str]:
        # The row's own columns: a reverse relation (a model's replicas) is not its change.
        left = {*leave_out, *KEPT_UP}
        return [f.name for f in model._meta.concrete_fields if f.name not in left]

    for model in (Model, EngineProfile, Adapter, WantedEngine, Team, Price):
        auditlog.register(model, include_fields=fields(model))
    auditlog.register(Node, include_fields=NODE_FIELDS)
    auditlog.register(ApiKey, include_fields=fields(ApiKey, SECRETS))
    auditlog.register(JoinToken, include_fields=fields(JoinToken, [*SECRETS, "uses"]))
    auditlog.register(NodeCredential, include_fields=fields(NodeCredential, SECRETS))
    user_model = get_user_model()
    auditlog.register(
        user_model,
        include_fields=[*fields(user_model, ["password", "last_login"]), "groups"],
        m2m_fields={"groups", "user_permissions"},
    )
    auditlog.register(Group, include_fields=["name", "permissions"], m2m_fields={"permissions"})
    pre_save.connect(stamp, sender=LogEntry, dispatch_uid="llmgw-audit-stamp")
    post_save.connect(log_line, sender=LogEntry, dispatch_uid="llmgw-audit-log")


# ---- web requests -------------------------------------------------------------------------


@functools.cache
def _console_path() -> str:
    # The console's pages sit under the admin's path (llmgw_site/urls.py), before its own.
    from django.urls import reverse

    return reverse("console:cluster")


def door_of(request) -> str:
    path = request.path_info
    if path.startswith(_console_path()):
        return "console"
    if path.startswith("/admin/"):
        return "admin"
    if path.startswith("/api/"):
        agent = request.headers.get("User-Agent", "")
        return "llmgw" if agent.startswith("llmgw/") else "api"
    return "console"


class AuditMiddleware:
    """Opens each request's scope: its door, its user (an API key's: ``act_as``), its address.

    After AuthenticationMiddleware. The address is the client's as the server
    saw it: behind the balancer, uvicorn's --forwarded-allow-ips makes it the
    client's own.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return self.get_response(request)  # reads change nothing
        user = getattr(request, "user", None)
        with acting(
            door_of(request),
            user if getattr(user, "is_authenticated", False) else None,
            request.META.get("REMOTE_ADDR"),
            request=f"{request.method} {request.path_info}",
        ):
            return self.get_response(request)
