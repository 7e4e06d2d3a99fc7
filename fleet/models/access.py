"""Secrets: join tokens, node credentials and API keys, all stored hashed.

Each secret is ``<kind>_<prefix>_<random>``. The prefix is stored in clear to find
the row and show operators which secret is which; only a SHA-256 of the whole
secret is kept. SHA-256 rather than a slow hash because these are 256-bit random
tokens, not passwords: there is nothing to guess.
"""

import hashlib
import hmac
import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from .choices import ApiKeyScope
from .nodes import Node


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def make_secret(kind: str) -> tuple[str, str]:
    """A new secret and its prefix."""
    prefix = secrets.token_hex(4)
    return f"{kind}_{prefix}_{secrets.token_urlsafe(32)}", prefix


def bearer_secret(headers) -> str | None:
    """The secret of an ``Authorization: Bearer <secret>`` header among ASGI headers.

    None when there is no Authorization header; ValueError when there is one of
    another kind. The agents' socket and the gateway both read their callers so.
    """
    for name, value in headers:
        if name == b"authorization":
            text = value.decode("latin-1").strip()
            if text[:7].lower() != "bearer ":
                raise ValueError("the Authorization header must be 'Bearer <secret>'")
            return text[7:].strip()
    return None


def api_key_refusal(name: str, prefix: str, *, revoked: bool, expired: bool) -> tuple[str, str]:
    """Why an API key may not be used now, as (code, message); ("", "") when it may.

    One wording for the management API and the gateway; the code is OpenAI's
    style of error code, which the gateway returns beside the message.
    """
    if revoked:
        return "revoked_api_key", f"API key '{name}' ({prefix}) has been revoked"
    if expired:
        return "expired_api_key", f"API key '{name}' ({prefix}) has expired"
    return "", ""


def split_prefix(secret: str, kind: str) -> str | None:
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != kind or len(parts[1]) != 8:
        return None
    return parts[1]


class _Secret(models.Model):
    KIND = ""
    prefix = models.CharField(max_length=8, db_index=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @classmethod
    def issue(cls, **fields):
        """Create one; returns (row, secret). The secret exists nowhere else afterwards."""
        secret, prefix = make_secret(cls.KIND)
        row = cls.objects.create(prefix=prefix, secret_hash=hash_secret(secret), **fields)
        return row, secret

    @classmethod
    def find(cls, secret: str, queryset=None):
        """The row this secret belongs to, revoked or not, or None."""
        prefix = split_prefix(secret or "", cls.KIND)
        if prefix is None:
            return None
        digest = hash_secret(secret)
        for row in (queryset if queryset is not None else cls.objects).filter(prefix=prefix):
            if hmac.compare_digest(row.secret_hash, digest):
                return row
        return None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class JoinToken(_Secret):
    """Lets new nodes enrol: each use creates one node and hands it its own credential."""

    KIND = "lgj"
    name = models.CharField(max_length=128, help_text="What it is for, e.g. 'rack 4'.")
    expires_at = models.DateTimeField()
    max_uses = models.PositiveIntegerField(default=1)
    uses = models.PositiveIntegerField(default=0, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"

    def usable(self, now=None) -> str | None:
        """None when it can enrol a node, else why not."""
        now = now or timezone.now()
        if self.revoked_at:
            return "join token revoked"
        if self.expires_at <= now:
            return "join token expired"
        if self.uses >= self.max_uses:
            return f"join token used up ({self.uses} of {self.max_uses})"
        return None


class NodeCredential(_Secret):
    """A node's own secret. It names exactly one node, and lets an agent act only as it."""

    KIND = "lgn"
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="credentials")
    join_token = models.ForeignKey(JoinToken, null=True, blank=True, on_delete=models.SET_NULL)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.node_id} ({self.prefix})"


class ApiKey(_Secret):
    """A client's key for the gateway (``inference``) or the management API (``manage``)."""

    KIND = "lgk"
    name = models.CharField(max_length=128)
    scope = models.CharField(
        max_length=16, choices=ApiKeyScope.choices, default=ApiKeyScope.INFERENCE
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        help_text="For manage keys: the user the API acts as.",
    )
    team = models.ForeignKey(
        "Team",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="api_keys",
        help_text="The team that owns it: its members manage it, and what it uses counts "
        "against the team's token quota. Empty: the fleet's.",
    )
    allowed_models = models.JSONField(
        default=list, blank=True, help_text="Model names this key may use. Empty: all."
    )
    fallbacks = models.JSONField(
        default=list,
        blank=True,
        help_text="Inference keys: models to answer through this key, in order, when the "
        "model asked for and its own fallbacks cannot; the answer says so "
        '(x-llmgw-fallback). A list of model names, e.g. ["qwen-7b"].',
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Limits (docs/gateway.md). Empty: the LLMGW_GATEWAY_DEFAULT_* setting; 0: no limit.
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests per minute. Empty: the default; 0: no limit."
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Prompt + completion tokens per minute. Empty: the default; 0: no limit.",
    )
    tokens_per_day = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Token budget per UTC day. Empty: the default; 0: none."
    )
    tokens_per_month = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Token budget per UTC calendar month. Empty: the default; 0: none.",
    )
    # Fair share when a model is busy (docs/gateway.md, "Fair share").
    max_concurrent = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Requests in flight at once through this key; more wait their turn. "
        "Empty or 0: no bound.",
    )
    share_weight = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Its share (1 to 100) against other keys' when a model's replicas are all "
        "busy: a key of weight 2 is given twice the requests of a key of weight 1.",
    )
    # Rotation: the secret before the last rotation, accepted until this time.
    previous_secret_hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        verbose_name = "API key"
        permissions = [
            # A key acts as its owner: minting, rotating or revoking someone else's
            # is acting as them, which add/change_apikey alone must not allow.
            (
                "manage_others_api_keys",
                "Can mint, rotate and revoke API keys of other users",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"

    @classmethod
    def find(cls, secret: str, queryset=None):
        """As for any secret, and a rotated key's previous secret during its grace."""
        found = super().find(secret, queryset)
        if found is not None or split_prefix(secret or "", cls.KIND) is None:
            return found
        digest = hash_secret(secret)
        rows = (queryset if queryset is not None else cls.objects).filter(
            prefix=split_prefix(secret, cls.KIND), previous_secret_expires_at__gt=timezone.now()
        )
        for row in rows:
            if row.previous_secret_hash and hmac.compare_digest(row.previous_secret_hash, digest):
                return row
        return None

    def usable(self, now=None) -> str | None:
        """None when it may be used now, else why not (the gateway's wording too)."""
        now = now or timezone.now()
        _, why = api_key_refusal(
            self.name,
            self.prefix,
            revoked=self.revoked_at is not None,
            expired=self.expires_at is not None and self.expires_at <= now,
        )
        return why or None


class KeyUsage(models.Model):
    """Tokens one key used on one model in one hour (UTC), from the engines' ``usage``.

    Written by the gateways in batches (fleet.gateway.usage), never per request.
    """

    key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="usage")
    model = models.CharField(max_length=128)
    hour = models.DateTimeField(help_text="The start of the hour, UTC.")
    requests = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-hour", "key", "model"]
        constraints = [
            models.UniqueConstraint(fields=["key", "model", "hour"], name="key_usage_unique")
        ]
        indexes = [models.Index(fields=["hour"])]
        verbose_name_plural = "key usage"

    def __str__(self) -> str:
        return f"{self.key_id} {self.model} {self.hour:%Y-%m-%d %H}:00"
