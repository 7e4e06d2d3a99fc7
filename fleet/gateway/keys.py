"""API keys, cached in memory so that checking one costs no database query.

The whole table of keys is small (one row per client) and is reloaded on a
doorbell from the channel layer and every few seconds regardless, so a
revocation reaches every gateway process within seconds even when the doorbell
is lost. Keys are found by the SHA-256 of the secret, the same digest the
database stores; a dict lookup on a digest leaks nothing about the secret.
"""

from dataclasses import dataclass

from fleet.models.access import api_key_refusal, bearer_secret, hash_secret, split_prefix

from .errors import GatewayError


@dataclass(frozen=True)
class KeyEntry:
    id: int
    name: str
    prefix: str
    scope: str
    allowed_models: frozenset  # empty: every model
    expires_at: float | None  # unix seconds
    revoked: bool

    def may_use(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


def load_keys() -> dict[str, KeyEntry]:
    """Every API key by its digest. Revoked ones too, so the client hears why it was refused."""
    from fleet.models import ApiKey

    rows = ApiKey.objects.values_list(
        "pk", "name", "prefix", "scope", "allowed_models", "expires_at", "revoked_at", "secret_hash"
    )
    return {
        digest: KeyEntry(
            pk,
            name,
            prefix,
            scope,
            frozenset(m for m in (allowed or []) if isinstance(m, str)),
            expires.timestamp() if expires else None,
            revoked is not None,
        )
        for pk, name, prefix, scope, allowed, expires, revoked, digest in rows
    }


def bearer(headers) -> str:
    try:
        secret = bearer_secret(headers)
    except ValueError:
        raise GatewayError(
            401, "the Authorization header must be 'Bearer <API key>'", code="invalid_api_key"
        ) from None
    if secret is None:
        raise GatewayError(
            401,
            "no API key: send it as 'Authorization: Bearer <API key>'",
            code="missing_api_key",
        )
    return secret


def digest_of(secret: str) -> str | None:
    """The digest to look up, or None when the secret is not shaped like an llmgw API key."""
    if split_prefix(secret, "lgk") is None:
        return None
    return hash_secret(secret)


def check(entry: KeyEntry | None, secret: str, now: float) -> KeyEntry:
    """The key, if it may use the gateway now; otherwise the 401/403 that says why."""
    if entry is None:
        shown = secret[:12] + "..." if len(secret) > 12 else "(too short)"
        raise GatewayError(401, f"invalid API key {shown}", code="invalid_api_key")
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
