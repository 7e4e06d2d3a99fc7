"""API keys, cached in memory so that checking one costs no database query.

The whole table of keys is small (one row per client) and is reloaded on a
doorbell from the channel layer and every few seconds regardless, so a
revocation reaches every gateway process within seconds even when the doorbell
is lost. Keys are found by the SHA-256 of the secret, the same digest the
database stores; a dict lookup on a digest leaks nothing about the secret.
"""

import dataclasses
import math
import time
from dataclasses import dataclass

from fleet.conf import fleet_settings
from fleet.models.access import api_key_refusal, bearer_secret, hash_secret, split_prefix
from fleet.services.batches import credentials
from fleet.services.costs import budgets

from .errors import GatewayError
from .limit_answers import NO_LIMITS, KeyLimits, Windows, reset_text
from .ratelimit import REFUSED


@dataclass(frozen=True)
class KeyEntry:
    id: int
    name: str
    prefix: str
    scope: str
    allowed_models: frozenset  # empty: every model
    expires_at: float | None  # unix seconds
    revoked: bool
    limits: KeyLimits = NO_LIMITS
    rotated: bool = False  # the secret before a rotation; expires_at ends its grace
    fallbacks: tuple[str, ...] = ()  # tried in order after the model's own
    max_concurrent: int = 0  # requests in flight at once (0: no bound); fair.py
    share_weight: int = 1  # its share when a model is busy, against other keys'
    team_id: int | None = None  # its team: models kept to a team answer only its keys
    # The request is a batch's line (an ``lgb_`` credential of this key): it takes only
    # what interactive requests leave (fleet.gateway.fair.batch_refusal).
    batch: bool = False
    # Its team has spent its budget in money (fleet.services.costs.budgets): why, and the
    # UTC month ("202612") that is true of; a month after it, the key is served again.
    spent: str = ""
    spent_month: str = ""

    def may_use(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models

    def may_call(self, route) -> bool:
        """Whether this key may call ``route`` (a model or adapter): its allowed models,
        and a model kept to its team's keys only by those (fleet.models.Model.private)."""
        kept = route.kept_to
        return self.may_use(route.name) and (kept is None or kept[0] == self.team_id)

    def fallbacks_for(self, route) -> tuple[str, ...]:
        """The models that may answer instead of ``route``: its own, then this key's."""
        if not self.fallbacks:
            return route.fallbacks
        own = route.fallbacks
        return own + tuple(n for n in self.fallbacks if n != route.name and n not in own)


def load_keys() -> dict[str, KeyEntry]:
    """Every API key by its digest. Revoked ones too, so the client hears why it was refused.

    A rotated key's previous secret maps to the same key until its grace ends.
    """
    from fleet.models import ApiKey

    c = fleet_settings()
    defaults = (
        c.gateway_default_requests_per_minute,
        c.gateway_default_tokens_per_minute,
        c.gateway_default_tokens_per_day,
        c.gateway_default_tokens_per_month,
    )
    rows = ApiKey.objects.values_list(
        "pk",
        "name",
        "prefix",
        "scope",
        "allowed_models",
        "expires_at",
        "revoked_at",
        "secret_hash",
        "requests_per_minute",
        "tokens_per_minute",
        "tokens_per_day",
        "tokens_per_month",
        "previous_secret_hash",
        "previous_secret_expires_at",
        "fallbacks",
        "max_concurrent",
        "share_weight",
        "team_id",
        "team__name",
        "team__tokens_per_month",
        "team__budget_per_month",
        "team__budget_currency",
        "team__spent_this_month",
        "team__spent_updated_at",
    )
    found = {}
    for pk, name, prefix, scope, allowed, expires, revoked, digest, *rest in rows:
        own, (previous, grace, fallbacks, concurrent, weight, team_id, team, budget) = (
            rest[:4],
            rest[4:12],
        )
        spent, spent_month = _spent(team, *rest[12:])
        limits = KeyLimits(
            *(d if v is None else v for v, d in zip(own, defaults, strict=True)),
            team_id=team_id or 0,
            team=team or "",
            team_tokens_per_month=budget or 0,
        )
        entry = found[digest] = KeyEntry(
            pk,
            name,
            prefix,
            scope,
            frozenset(m for m in (allowed or []) if isinstance(m, str)),
            expires.timestamp() if expires else None,
            revoked is not None,
            limits if limits.on else NO_LIMITS,
            fallbacks=tuple(n for n in (fallbacks or []) if isinstance(n, str)),
            max_concurrent=concurrent or 0,
            share_weight=weight or 1,
            team_id=team_id,
            spent=spent,
            spent_month=spent_month,
        )
        if previous and grace is not None:
            ends = grace.timestamp()
            if entry.expires_at is not None:
                ends = min(ends, entry.expires_at)
            found[previous] = dataclasses.replace(entry, expires_at=ends, rotated=True)
    return found


def _spent(team, budget, currency, spent, counted_at) -> tuple[str, str]:
    """(why, month) when the team has spent its budget in money as last counted, else ("", "")."""
    if team is None or budget is None or spent is None or counted_at is None or spent < budget:
        return "", ""
    return budgets.spent_refusal(team, budget, currency, spent), counted_at.strftime("%Y%m")


def check_budget(entry: KeyEntry, now: float) -> None:
    """The 429 of a key whose team has spent its budget this month (no I/O)."""
    if not entry.spent:
        return
    w = Windows.at(now)
    if entry.spent_month != w.month:
        return  # counted in a month that is over: the next count starts afresh
    REFUSED.labels("team_budget").inc()
    raise GatewayError(
        429,
        f"{entry.spent}; try again in {reset_text(w.month_left)}, or once the budget is raised",
        code="insufficient_quota",
        retry_after=math.ceil(w.month_left),
    )


def bearer(headers) -> str:
    """The API key a request carries: ``Authorization: Bearer <key>``, as OpenAI's clients
    send it, else ``x-api-key: <key>``, as Anthropic's do."""
    try:
        secret = bearer_secret(headers)
    except ValueError:
        raise GatewayError(
            401, "the Authorization header must be 'Bearer <API key>'", code="invalid_api_key"
        ) from None
    if secret is None:
        secret = api_key_header(headers)
    if secret is None:
        raise GatewayError(
            401,
            "no API key: send it as 'Authorization: Bearer <API key>' (or 'x-api-key: <API key>')",
            code="missing_api_key",
        )
    return secret


def api_key_header(headers) -> str | None:
    """The secret of an ``x-api-key`` header among ASGI headers; None without one."""
    for name, value in headers:
        if name == b"x-api-key":
            return value.decode("latin-1").strip()
    return None


def digest_of(secret: str) -> str | None:
    """The digest to look up, or None when the secret is not shaped like an llmgw API key.

    A batch's credential (``lgb_``, signed by this installation) names its key's digest.
    """
    if split_prefix(secret, "lgk") is None:
        return credentials.key_digest(secret)
    return hash_secret(secret)


def as_batch(entry: KeyEntry, secret: str) -> KeyEntry:
    """The key as a batch line's request carries it: the same key, marked ``batch``."""
    if not secret.startswith(BATCH_PREFIX):
        return entry
    return dataclasses.replace(entry, batch=True)


BATCH_PREFIX = f"{credentials.KIND}_"


def check(entry: KeyEntry | None, secret: str, now: float) -> KeyEntry:
    """The key, if it may use the gateway now; otherwise the 401/403 that says why."""
    if entry is None:
        shown = secret[:12] + "..." if len(secret) > 12 else "(too short)"
        raise GatewayError(401, f"invalid API key {shown}", code="invalid_api_key")
    if secret.startswith(f"{credentials.KIND}_") and credentials.key_digest(secret, now) is None:
        # Checked on every request, not only when first seen: a process keeps the
        # digests of the headers it has read, and a batch's credential has an end.
        raise GatewayError(401, "the batch credential has expired", code="expired_api_key")
    if entry.rotated and entry.expires_at <= now and not entry.revoked:
        raise GatewayError(
            401,
            f"API key '{entry.name}' ({entry.prefix}) was rotated; its old secret stopped "
            f"working at {time.strftime('%Y-%m-%d %H:%M', time.gmtime(entry.expires_at))} UTC",
            code="expired_api_key",
        )
    code, why = api_key_refusal(
        entry.name,
        entry.prefix,
        revoked=entry.revoked,
        expired=entry.expires_at is not None and entry.expires_at <= now,
    )
    if why:
        raise GatewayError(401, why, code=code)
    if entry.scope != "inference":
        raise GatewayError(
            403,
            f"API key '{entry.name}' is a {entry.scope} key; the gateway needs an inference key",
            code="wrong_key_scope",
        )
    return entry
