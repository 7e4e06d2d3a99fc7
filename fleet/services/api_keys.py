"""API keys for the gateway and the management API, and the lifetimes operators type."""

import logging
import re
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.models import ApiKey, ApiKeyScope, Model

from . import doorbells

logger = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """'90s', '30m', '24h', '7d', '2w' -> timedelta. Raises ValueError naming the input."""
    m = _DURATION.match(text or "")
    if not m or int(m.group(1)) == 0:
        raise ValueError(
            f"'{text}' is not a positive duration (use a number and s, m, h, d or w, e.g. 24h)"
        )
    return timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])


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
) -> list[str]:
    """Raise ApiKeyError for a key that could never work; return the allowed models, sorted.

    A manage key acts as its user and only staff may manage; model names must
    exist, since a typo would otherwise lock a client out without a word.
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
        if missing := [m for m in allowed if m not in known]:
            raise ApiKeyError("allowed_models", f"unknown model(s): {', '.join(missing)}")
    if expires_at is not None and expires_at <= timezone.now():
        raise ApiKeyError("expires_at", "an API key cannot expire in the past")
    return allowed


def create_api_key(
    name: str,
    *,
    scope: str = ApiKeyScope.INFERENCE,
    user=None,
    allowed_models: list[str] | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """A new API key; returns (key, secret). The secret is shown once and kept only hashed.

    Raises ApiKeyError (see check_api_key) and creates nothing for bad input.
    """
    allowed = check_api_key(
        name, scope=scope, user=user, allowed_models=allowed_models, expires_at=expires_at
    )
    key, secret = ApiKey.issue(
        name=name.strip(), scope=scope, user=user, allowed_models=allowed, expires_at=expires_at
    )
    logger.info(
        "api key created name=%s prefix=%s scope=%s user=%s",
        key.name,
        key.prefix,
        scope,
        user.get_username() if user else "-",
    )
    return key, secret


def revoke_api_key(key: ApiKey) -> bool:
    """Revoke a key; returns whether it was live. Takes effect on its next request."""
    changed = bool(
        ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    )
    if changed:
        logger.warning("api key revoked name=%s prefix=%s", key.name, key.prefix)
        # Gateways cache keys: ring them rather than wait for their safety refresh.
        doorbells.ring_gateways("keys")
    return changed
