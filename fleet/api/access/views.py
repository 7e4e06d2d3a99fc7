"""The routes of secrets and their use: ``join-tokens/``, ``api-keys/`` and ``usage/``.

Its one reason to change: what an operator may ask of join tokens and API keys through
the API (mint, limit, rotate, revoke), and how the tokens keys used are asked for.
"""

from datetime import UTC

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from fleet.models import ApiKey, KeyUsage, Model, Team
from fleet.services import access, api_keys, permissions

from ..common import Conflict
from . import serializers


class JoinTokenViewSet(viewsets.ViewSet):
    """Join tokens that let new nodes enrol, as ``manage.py create_join_token`` makes them."""

    queryset = Model.objects.none()
    action_permissions = {"create": list(permissions.needs("join_token.create"))}

    @extend_schema(
        request=serializers.JoinTokenRequestSerializer,
        responses={201: serializers.SecretSerializer},
    )
    def create(self, request):
        """A new join token; its secret is in this answer only."""
        body = serializers.JoinTokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            ttl = api_keys.parse_duration(data["ttl"])
            token, secret = access.create_join_token(
                data["name"], ttl=ttl, max_uses=data["uses"], actor=request.user
            )
        except ValueError as exc:
            raise ValidationError({"detail": [str(exc)]}) from None
        return Response(
            {"name": token.name, "prefix": token.prefix, "secret": secret,
             "expires_at": token.expires_at, "uses": token.max_uses},
            status=status.HTTP_201_CREATED,
        )  # fmt: skip


class ApiKeyViewSet(viewsets.ViewSet):
    """API keys, as ``manage.py create_api_key`` makes them. A key made here is the asking
    user's own unless ``user`` names another, which needs ``manage_others_api_keys``; so
    does rotating or revoking a key that is not one's own."""

    queryset = ApiKey.objects.none()
    lookup_field = "prefix"
    # The gate; whose key it is, the service checks (api_keys.check_actor).
    action_permissions = {
        "create": list(permissions.needs("api_key.create")),
        "partial_update": list(permissions.needs("api_key.set_limits")),
        "rotate": list(permissions.needs("api_key.rotate")),
        "revoke": list(permissions.needs("api_key.revoke")),
    }

    @extend_schema(
        request=serializers.ApiKeyRequestSerializer,
        responses={201: serializers.SecretSerializer},
    )
    def create(self, request):
        """A new API key; its secret is in this answer only."""
        body = serializers.ApiKeyRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        owner = request.user
        if data.get("user") and data["user"] != request.user.get_username():
            # Before looking the name up: whether a user exists is not for the refused.
            permissions.require(
                request.user,
                [permissions.OTHERS_API_KEYS],
                f"mint an API key of user '{data['user']}'",
            )
            owner = _user(data["user"])
        try:
            expires_at = api_keys.parse_expiry(data["expires"]) if data.get("expires") else None
            key, secret = api_keys.create_api_key(
                data["name"],
                scope=data["scope"],
                user=owner,
                allowed_models=data.get("models") or [],
                expires_at=expires_at,
                limits={f: data[f] for f in api_keys.LIMIT_FIELDS if f in data},
                fallbacks=data.get("fallbacks") or [],
                team=_team(data["team"]) if data.get("team") else None,
                actor=request.user,
            )
        except ValueError as exc:
            raise ValidationError({"detail": [str(exc)]}) from None
        return Response(
            {"name": key.name, "prefix": key.prefix, "secret": secret,
             "expires_at": key.expires_at, "scope": key.scope,
             "user": key.user.get_username() if key.user else None},
            status=status.HTTP_201_CREATED,
        )  # fmt: skip

    @extend_schema(request=serializers.ApiKeyChangeSerializer, responses={200: OpenApiTypes.OBJECT})
    def partial_update(self, request, prefix=None):
        """Change a key's limits — a number (0: none) or null (the gateway's default) — and
        its fallbacks, in order ([]: none)."""
        key = _api_key(prefix)
        body = serializers.ApiKeyChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        fallbacks = data.pop("fallbacks", None)
        try:
            with transaction.atomic():
                if data:
                    api_keys.set_limits(key, data, actor=request.user)
                if fallbacks is not None:
                    api_keys.set_fallbacks(key, fallbacks, actor=request.user)
        except api_keys.ApiKeyError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        return Response(
            {"name": key.name, "prefix": key.prefix, **_limits(key), "fallbacks": key.fallbacks}
        )

    @extend_schema(
        request=serializers.ApiKeyRotateSerializer,
        responses={
            201: OpenApiTypes.OBJECT,
            409: OpenApiResponse(description="The key is revoked: it cannot get a new secret."),
        },
    )
    @action(detail=True, methods=["post"])
    def rotate(self, request, prefix=None):
        """A new secret, in this answer only; the old one keeps working for ``grace``."""
        key = _api_key(prefix)
        body = serializers.ApiKeyRotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            secret = api_keys.rotate_api_key(
                key, api_keys.parse_duration(body.validated_data["grace"]), actor=request.user
            )
        except OverflowError:
            raise ValidationError({"grace": ["a grace period that long is not a date"]}) from None
        except api_keys.ApiKeyError as exc:
            if exc.field == "key":  # revoked: the request is fine, the key's state is not
                raise Conflict(str(exc)) from None
            raise ValidationError({exc.field or "detail": [str(exc)]}) from None
        except ValueError as exc:
            raise ValidationError({"detail": [str(exc)]}) from None
        return Response(
            {"name": key.name, "prefix": key.prefix, "secret": secret,
             "expires_at": key.expires_at, "old_secret_until": key.previous_secret_expires_at},
            status=status.HTTP_201_CREATED,
        )  # fmt: skip

    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["post"])
    def revoke(self, request, prefix=None):
        """Refuse this key from now on; it cannot be undone. Idempotent."""
        key = _api_key(prefix)
        live = api_keys.revoke_api_key(key, actor=request.user)
        return Response({"name": key.name, "prefix": key.prefix, "revoked": live})


def _user(username: str):
    User = get_user_model()
    user = User.objects.filter(**{User.USERNAME_FIELD: username}).first()
    if user is None:
        raise ValidationError({"user": [f"no user '{username}'"]})
    return user


def _team(name: str) -> Team:
    team = Team.objects.filter(name=name).first()
    if team is None:
        known = ", ".join(Team.objects.values_list("name", flat=True)) or "none"
        raise ValidationError({"team": [f"no team named '{name}' (teams: {known})"]})
    return team


def _api_key(prefix: str) -> ApiKey:
    key = ApiKey.objects.filter(prefix=prefix).first()
    if key is None:
        raise NotFound(f"no API key with prefix '{prefix}'")
    return key


def _limits(key: ApiKey) -> dict:
    return {f: getattr(key, f) for f in api_keys.LIMIT_FIELDS}


class UsageViewSet(viewsets.ViewSet):
    """Tokens per key, model and hour (UTC), as the gateways count them from the engines'
    ``usage``; written in batches, so the last few seconds may not be here yet."""

    queryset = KeyUsage.objects.none()

    @extend_schema(
        parameters=[
            OpenApiParameter("key", str, description="A key's prefix or name."),
            OpenApiParameter("model", str),
            OpenApiParameter(
                "since", str, description="24h, 7d… or an ISO 8601 time (default 7d)."
            ),
        ],
        responses={200: serializers.KeyUsageSerializer(many=True)},
    )
    def list(self, request):
        since_text = request.query_params.get("since") or "7d"
        try:
            since = timezone.now() - api_keys.parse_duration(since_text)
        except (ValueError, OverflowError):
            try:
                when = parse_datetime(since_text.strip().replace("Z", "+00:00"))
            except ValueError:
                when = None
            if when is None:
                raise ValidationError(
                    {"since": [f"'{since_text}' is neither a duration (7d) nor an ISO 8601 time"]}
                ) from None
            since = when if timezone.is_aware(when) else when.replace(tzinfo=UTC)
        rows = api_keys.usage(
            key=request.query_params.get("key"),
            model=request.query_params.get("model"),
            since=since,
        )
        return Response(serializers.KeyUsageSerializer(rows[:10_000], many=True).data)
