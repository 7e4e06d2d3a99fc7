"""API keys for the gateway and the management API, and the lifetimes operators type."""

import logging
import re
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agentd.ctl.times import UNITS_S
from fleet import audit
from fleet.models import Adapter, ApiKey, ApiKeyScope, Model
from fleet.models.access import hash_secret, make_secret
from fleet.models.catalog import fallbacks_problem

from . import doorbells, permissions, reach, teams
from .permissions import SYSTEM

logger = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d|w)\s*$")


def parse_duration(text: str) -> timedelta:
    """'90s', '30m', '24h', '7d', '2w' -> timedelta. Raises ValueError naming the input."""
    m = _DURATION.match(text or "")
    if not m or int(m.group(1)) == 0:
        raise ValueError(
            f"'{text}' is not a positive duration (use a number and s, m, h, d or w, e.g. 24h)"
        )
    return timedelta(seconds=int(m.group(1)) * UNITS_S[m.group(2)])


def parse_expiry(text: str, now: datetime | None = None) -> datetime:
    """A duration from now ('30d') or an ISO 8601 time ('2027-01-31T00:00Z')."""
    now = now or timezone.now()
    try:
        return now + parse_duration(text)
    except ValueError:
        pass
    try:
        when = parse_datetime(text.strip().replace("Z", "+00:00")) if text else None
    except ValueError:
        when = None
    if when is None:
        raise ValueError(
            f"'{text}' is neither a duration (e.g. 30d) nor an ISO 8601 time "
            "(e.g. 2027-01-31T00:00Z)"
        )
    if timezone.is_naive(when):
        when = when.replace(tzinfo=UTC)
    if when <= now:
        raise ValueError(f"expiry {when:%Y-%m-%d %H:%M} UTC is in the past")
    return when


class ApiKeyError(ValueError):
    """A key that could never work. ``field`` names the input at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def check_api_key(
    name: str,
    *,
    scope: str,
    user=None,
    allowed_models: list[str] | None = None,
    expires_at: datetime | None = None,
    fallbacks: list[str] | None = None,
    team=None,
) -> list[str]:
    """Raise ApiKeyError for a key that could never work; return the allowed models, sorted.

    A manage key acts as its user and only staff may manage; model names must
    exist, since a typo would otherwise lock a client out without a word; and a key
    of ``team`` names no model kept to another team's keys (fleet.services.reach).
    """
    if not (name or "").strip():
        raise ApiKeyError("name", "an API key needs a name")
    if scope not in ApiKeyScope.values:
        raise ApiKeyError(
            "scope", f"unknown scope '{scope}'; choose one of {', '.join(ApiKeyScope.values)}"
        )
    allowed = sorted(set(allowed_models or []))
    if scope == ApiKeyScope.MANAGE:
        if user is None:
            raise ApiKeyError("user", "a manage key needs a user to act as")
        if not user.is_staff or not user.is_active:
            raise ApiKeyError("user", f"user '{user.get_username()}' is not an active staff user")
        if allowed:
            raise ApiKeyError("allowed_models", "allowed models apply to inference keys only")
    if allowed:
        known = set(Model.objects.filter(name__in=allowed).values_list("name", flat=True))
        known |= set(Adapter.objects.filter(name__in=allowed).values_list("name", flat=True))
        if missing := [m for m in allowed if m not in known]:
            raise ApiKeyError(
                "allowed_models", f"unknown model(s) or adapter(s): {', '.join(missing)}"
            )
        team_id = getattr(team, "pk", team)
        if problem := reach.key_models_problem(team_id, allowed, "allowed models"):
            raise ApiKeyError("allowed_models", problem)
    if expires_at is not None and expires_at <= timezone.now():
        raise ApiKeyError("expires_at", "an API key cannot expire in the past")
    check_fallbacks(fallbacks, scope=scope, allowed=allowed, team=team)
    return allowed


def check_fallbacks(names, *, scope: str, allowed, team=None) -> None:
    """Raise ApiKeyError unless ``names`` are fallbacks a key of this scope and ``team``
    (a Team, its id, or None) could use."""
    if names is None:
        return
    if problem := fallbacks_problem(names):
        raise ApiKeyError("fallbacks", problem)
    if problem := reach.key_models_problem(getattr(team, "pk", team), names, "fallbacks"):
        raise ApiKeyError("fallbacks", problem)
    if names and scope == ApiKeyScope.MANAGE:
        raise ApiKeyError("fallbacks", "fallbacks apply to inference keys only")
    if allowed and (barred := [n for n in names if n not in allowed]):
        raise ApiKeyError(
            "fallbacks",
            f"the key may not use {', '.join(repr(n) for n in barred)}: "
            "add it to the key's models or leave it out",
        )


def _whose(owner) -> str:
    return f"user '{owner.get_username()}'" if owner is not None else "no user"


def check_actor(actor, action: str, owner, verb: str, key: ApiKey | None = None) -> None:
    """Raise permissions.Refused unless ``actor`` may do ``action`` to a key of ``owner``.

    The action's own permission (add or change_apikey); the key's team's scope
    (fleet.services.teams) for an existing ``key``; and for a key that is not the
    actor's own — another user's, or one of no user — also
    ``manage_others_api_keys``: a key acts as its owner, so making or taking
    one for someone else is acting as them.
    """
    permissions.require_action(actor, action, f"{verb} an API key", on=key)
    if actor is SYSTEM or (owner is not None and owner.pk == actor.pk):
        return
    permissions.require(
        actor, [permissions.OTHERS_API_KEYS], f"{verb} an API key of {_whose(owner)}"
    )


LIMIT_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "tokens_per_day",
    "tokens_per_month",
    "max_concurrent",
    "share_weight",
)


def check_limits(limits: dict | None) -> dict:
    """The limits given, checked: each a whole number >= 0 (0: no limit) or None (the default)."""
    checked = {}
    for name, value in (limits or {}).items():
        if name not in LIMIT_FIELDS:
            raise ApiKeyError(
                name, f"unknown limit '{name}'; choose from {', '.join(LIMIT_FIELDS)}"
            )
        if name == "share_weight":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
                raise ApiKeyError(name, "share_weight must be a whole number from 1 to 100")
        elif value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ApiKeyError(
                name, f"{name} must be a whole number, 0 for no limit, or empty for the default"
            )
        checked[name] = value
    return checked


def create_api_key(
    name: str,
    *,
    scope: str = ApiKeyScope.INFERENCE,
    user=None,
    allowed_models: list[str] | None = None,
    expires_at: datetime | None = None,
    limits: dict | None = None,
    fallbacks: list[str] | None = None,
    team=None,
    actor=SYSTEM,
) -> tuple[ApiKey, str]:
    """A new API key for ``user``; returns (key, secret). The secret is shown once and kept
    only hashed.

    Raises permissions.Refused when ``actor`` may not make it (``check_actor``) and
    ApiKeyError (see check_api_key) for bad input; either way it creates nothing.
    """
    check_actor(actor, "api_key.create", user, "mint")
    team = teams.team_for_new(actor, team, "an API key")
    allowed = check_api_key(
        name,
        scope=scope,
        user=user,
        allowed_models=allowed_models,
        expires_at=expires_at,
        fallbacks=fallbacks,
        team=team,
    )
    key, secret = ApiKey.issue(
        name=name.strip(),
        scope=scope,
        user=user,
        allowed_models=allowed,
        fallbacks=fallbacks or [],
        expires_at=expires_at,
        team=team,
        **check_limits(limits),
    )
    logger.info(
        "api key created name=%s prefix=%s scope=%s user=%s by=%s",
        key.name,
        key.prefix,
        scope,
        user.get_username() if user else "-",
        permissions.name_of(actor),
    )
    return key, secret


def revoke_api_keys(keys, actor=SYSTEM) -> int:
    """Revoke these keys, all or none: Refused, naming a key the actor may not revoke,
    revokes nothing. Returns how many were live."""
    keys = list(keys)
    for key in keys:
        check_actor(actor, "api_key.revoke", key.user, f"revoke '{key.name}' ({key.prefix}),", key)
    return sum(revoke_api_key(k) for k in keys)


def revoke_api_key(key: ApiKey, actor=SYSTEM) -> bool:
    """Revoke a key; returns whether it was live. Takes effect on its next request."""
    check_actor(actor, "api_key.revoke", key.user, "revoke", key)
    now = timezone.now()
    changed = bool(ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=now))
    if changed:
        audit.record(key, {"revoked_at": (None, now)})
        logger.warning("api key revoked name=%s prefix=%s", key.name, key.prefix)
        # Gateways cache keys: ring them rather than wait for their safety refresh.
        doorbells.ring_gateways("keys")
    return changed


def set_limits(key: ApiKey, limits: dict, actor=SYSTEM) -> ApiKey:
    """Change a key's limits (None: back to the default); gateways hear of it at once.

    Limits are the operator's to set on anyone's key (change_apikey): they bound
    a key, they do not let anyone act as its owner."""
    permissions.require_action(actor, "api_key.set_limits", "change an API key's limits", on=key)
    limits = check_limits(limits)
    for name, value in limits.items():
        setattr(key, name, value)
    key.save(update_fields=list(limits))
    logger.info(
        "api key limits name=%s prefix=%s %s",
        key.name,
        key.prefix,
        " ".join(f"{k}={v}" for k, v in limits.items()),
    )
    doorbells.ring_gateways("keys")
    return key


def set_fallbacks(key: ApiKey, names: list[str], actor=SYSTEM) -> ApiKey:
    """Change the models a key falls back to, in order ([]: none); gateways hear at once.

    Like limits, fallbacks bound what a key's requests reach among the models it
    may use already, so change_apikey suffices, whoever owns the key."""
    permissions.require_action(actor, "api_key.set_limits", "change an API key's fallbacks", on=key)
    check_fallbacks(names, scope=key.scope, allowed=key.allowed_models, team=key.team_id)
    key.fallbacks = list(names)
    key.save(update_fields=["fallbacks"])
    logger.info(
        "api key fallbacks name=%s prefix=%s fallbacks=%s",
        key.name,
        key.prefix,
        ",".join(names) or "-",
    )
    doorbells.ring_gateways("keys")
    return key


def rotate_api_key(key: ApiKey, grace: timedelta, now: datetime | None = None, actor=SYSTEM) -> str:
    """A new secret for ``key``; the current one keeps working for ``grace``. Returns it.

    Only one old secret is kept: rotating again ends the previous one's grace.
    The new secret acts as the key's owner, so rotating another's key needs
    ``manage_others_api_keys`` (``check_actor``).
    """
    check_actor(actor, "api_key.rotate", key.user, "rotate", key)
    if key.revoked:
        raise ApiKeyError("key", f"API key '{key.name}' ({key.prefix}) is revoked")
    if grace < timedelta(0):
        raise ApiKeyError("grace", "the grace period cannot be negative")
    now = now or timezone.now()
    # The prefix stays the key's name for operators; the new secret carries it too.
    secret = f"{ApiKey.KIND}_{key.prefix}_{make_secret(ApiKey.KIND)[0].split('_', 2)[2]}"
    key.previous_secret_hash = key.secret_hash
    key.previous_secret_expires_at = now + grace
    key.secret_hash = hash_secret(secret)
    key.save(update_fields=["previous_secret_hash", "previous_secret_expires_at", "secret_hash"])
    logger.warning(
        "api key rotated name=%s prefix=%s old secret works until %s",
        key.name,
        key.prefix,
        f"{key.previous_secret_expires_at:%Y-%m-%d %H:%M} UTC",
    )
    doorbells.ring_gateways("keys")
    return secret


def usage(key: str | None = None, model: str | None = None, since: datetime | None = None):
    """Usage rows (KeyUsage) per key, model and hour, newest first, filtered.

    ``key`` is a key's prefix or name.
    """
    from django.db.models import Q

    from fleet.models import KeyUsage

    rows = KeyUsage.objects.select_related("key")
    if key:
        rows = rows.filter(Q(key__prefix=key) | Q(key__name=key))
    if model:
        rows = rows.filter(model=model)
    if since is not None:
        rows = rows.filter(hour__gte=since.replace(minute=0, second=0, microsecond=0))
    return rows.order_by("-hour", "key__name", "model")


def usage_totals(rows) -> list[dict]:
    """The rows summed per key and model: what an operator asks first."""
    from django.db.models import Sum

    return list(
        rows.order_by()
        .values("key__name", "key__prefix", "model")
        .annotate(
            requests=Sum("requests"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
        )
        .order_by("key__name", "model")
    )
