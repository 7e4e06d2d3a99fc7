"""What minting a join token or an API key, changing, rotating and reading a key's use take
and answer.

Its one reason to change: a field of those requests or answers added or read differently
(a new limit of a key, say).
"""

from rest_framework import serializers

from fleet.models import ApiKey

from ..common import BIGINT_MAX, INT_MAX, StrictCharField, fallbacks_field


class JoinTokenRequestSerializer(serializers.Serializer):
    name = StrictCharField(max_length=100, help_text="What it is for, e.g. 'rack 4'.")
    ttl = StrictCharField(default="24h", max_length=20, help_text="30m, 24h, 7d…")
    uses = serializers.IntegerField(default=1, min_value=1, max_value=100_000)


class ApiKeyLimitsSerializer(serializers.Serializer):
    requests_per_minute = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=INT_MAX,
        help_text="0: none; null: the default.",
    )
    tokens_per_minute = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=INT_MAX
    )
    tokens_per_day = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=BIGINT_MAX
    )
    tokens_per_month = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=BIGINT_MAX
    )
    max_concurrent = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=INT_MAX,
        help_text="Requests in flight at once; more wait their turn. 0 or null: no bound.",
    )
    share_weight = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=100,
        help_text="Its share against other keys' when a model is busy (default 1).",
    )


class ApiKeyChangeSerializer(ApiKeyLimitsSerializer):
    fallbacks = fallbacks_field(ApiKey)


class ApiKeyRequestSerializer(ApiKeyLimitsSerializer):
    name = StrictCharField(max_length=100, help_text="Who or what it is for.")
    scope = serializers.ChoiceField(choices=["inference", "manage"], default="inference")
    user = StrictCharField(
        required=False,
        max_length=150,
        help_text="Whose key it is (a manage key acts as them). Left out: the asking user's "
        "own. Naming another user needs fleet.manage_others_api_keys.",
    )
    models = serializers.ListField(
        child=StrictCharField(max_length=200),
        required=False,
        help_text="Inference keys: the models it may use (none listed: all).",
    )
    expires = StrictCharField(
        required=False, max_length=40, help_text="30d, 12h… or an ISO 8601 time."
    )
    fallbacks = fallbacks_field(ApiKey)
    team = StrictCharField(
        required=False,
        max_length=64,
        help_text="The team that owns it, by name. Left out: the asking user's team when "
        "they are in one.",
    )


class ApiKeyRotateSerializer(serializers.Serializer):
    grace = serializers.CharField(
        default="24h", max_length=20, help_text="How long the old secret still works."
    )


class KeyUsageSerializer(serializers.Serializer):
    key = serializers.CharField(source="key.name")
    prefix = serializers.CharField(source="key.prefix")
    model = serializers.CharField()
    hour = serializers.DateTimeField()
    requests = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()


class SecretSerializer(serializers.Serializer):
    name = serializers.CharField()
    prefix = serializers.CharField()
    secret = serializers.CharField(help_text="Shown in this answer only; kept hashed.")
    expires_at = serializers.DateTimeField(allow_null=True)
