"""How models and engine profiles read and are written through the API, and what applying or
explaining the catalog takes and answers.

Its one reason to change: a field of a model or an engine profile, a rule the API asks
of them beyond Model.clean() (whose they are, who may set a profile's args and env), or
the catalog's and explain's bodies.
"""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied

from fleet.models import Engine, EngineProfile, Model, ReplicaState, Team
from fleet.models.catalog import PRIORITY_MAX
from fleet.models.profiles import GPU_MEMORY_GB_MAX
from fleet.selectors import SELECTOR_PATTERN
from fleet.services import profiles, reach, teams
from fleet.services.autoscaler.status import scaling_status, sleep_status

from ..common import (
    INT_MAX,
    SMALLINT_MAX,
    NameRelatedField,
    StrictBooleanField,
    StrictCharField,
    ValidatedModelSerializer,
    actor_of,
    fallbacks_field,
    sha256_map,
)


def team_field(owner):
    """The team that owns a model, by its name; null: the fleet's."""
    return NameRelatedField(
        slug_field="name",
        queryset=Team.objects.all(),
        allow_null=True,
        required=False,
        help_text=owner._meta.get_field("team").help_text
        + " Left out of a new one: the asking user's team when they are in one.",
    )


class ModelSerializer(ValidatedModelSerializer):
    team = team_field(Model)
    active_profile = serializers.PrimaryKeyRelatedField(
        queryset=EngineProfile.objects.all(), allow_null=True, required=False
    )
    canary_profile = serializers.PrimaryKeyRelatedField(
        queryset=EngineProfile.objects.all(),
        allow_null=True,
        required=False,
        help_text=Model._meta.get_field("canary_profile").help_text,
    )
    fallbacks = fallbacks_field(Model)

    class Meta:
        model = Model
        fields = (
            "id",
            "name",
            "description",
            "team",
            "desired_replicas",
            "min_replicas",
            "max_replicas",
            "scale_to_zero_after_s",
            "target_outstanding",
            "max_waiting",
            "max_wait_s",
            "scaling",
            "sleep_after_s",
            "sleep_level",
            "stop_after_asleep_s",
            "sleep",
            "waiting_requests",
            "last_request_at",
            "last_scaled_at",
            "placement_policy",
            "priority",
            "private",
            "prefix_routing",
            "fallbacks",
            "canary_profile",
            "canary_percent",
            "canary_max_error_rate",
            "canary_max_ttft_ratio",
            "canary_window_s",
            "canary_min_requests",
            "canary_auto_promote",
            "canary_started_at",
            "replace_after_s",
            "weights_retention_s",
            "active_profile",
            "created_at",
            "updated_at",
        )
        read_only_fields = (
            "canary_started_at",
            "created_at",
            "updated_at",
            "waiting_requests",
            "last_request_at",
            "last_scaled_at",
        )
        # Model.clean() refuses a negative count; said here too, the schema says it.
        extra_kwargs = {
            "desired_replicas": {
                "min_value": 0,
                "max_value": INT_MAX,
                "error_messages": {"min_value": "replicas cannot be negative"},
            },
            "replace_after_s": {"max_value": INT_MAX},
            "target_outstanding": {"min_value": 0.001, "max_value": 1e6},
            "min_replicas": {"max_value": INT_MAX},
            "max_replicas": {"min_value": 1, "max_value": INT_MAX},
            "scale_to_zero_after_s": {"min_value": 1, "max_value": INT_MAX},
            "sleep_after_s": {
                "min_value": 1,
                "max_value": INT_MAX,
                "error_messages": {"min_value": "sleep_after_s must be at least 1"},
            },
            "stop_after_asleep_s": {
                "min_value": 1,
                "max_value": INT_MAX,
                "error_messages": {"min_value": "stop_after_asleep_s must be at least 1"},
            },
            "sleep_level": {
                "error_messages": {
                    "invalid_choice": "sleep_level is 1 (weights kept in host memory) or 2 "
                    "(weights dropped), not {input}"
                }
            },
            "max_waiting": {"min_value": 1, "max_value": INT_MAX},
            "max_wait_s": {"min_value": 1, "max_value": INT_MAX},
            "priority": {"min_value": 0, "max_value": PRIORITY_MAX},
        }

    scaling = serializers.SerializerMethodField(
        help_text='"scaled to zero", "starting for N waiting requests", '
        '"autoscaled MIN-MAX: N wanted"; empty without autoscaling.'
    )
    sleep = serializers.SerializerMethodField(
        help_text='"after 300 s idle, level 1" (", to zero after 3600 s asleep"), led by '
        '"N asleep; " while replicas sleep; empty for a model that never sleeps.'
    )

    def validate(self, attrs):
        # Before the model's rules: whose the model is comes first (fleet.services.teams).
        actor = actor_of(self)
        if self.instance is None:
            name = attrs.get("name", "")
            attrs["team"] = teams.team_for_new(actor, attrs.get("team"), f"model '{name}'")
        elif "team" in attrs and attrs["team"] != self.instance.team:
            teams.team_for_new(actor, attrs["team"], f"model '{self.instance.name}'")
        attrs = super().validate(attrs)
        # What it would point at beyond its team (fleet.services.reach).
        was = self.instance
        probe = Model(
            name=attrs.get("name", was.name if was else ""),
            team=attrs["team"] if "team" in attrs else (was.team if was else None),
            fallbacks=attrs.get("fallbacks", was.fallbacks if was else []),
        )
        before = (was.team_id, was.fallbacks) if was else None
        if why := reach.model_fallbacks_problem(actor, probe, before):
            raise PermissionDenied(why)
        return attrs

    def get_scaling(self, obj) -> str:
        ready = getattr(obj, "ready_count", None)
        if ready is None:
            ready = obj.replicas.filter(state=ReplicaState.READY).count() if obj.pk else 0
        return scaling_status(obj, ready)

    def get_sleep(self, obj) -> str:
        asleep = getattr(obj, "asleep_count", None)
        if asleep is None:
            asleep = obj.replicas.filter(state=ReplicaState.ASLEEP).count() if obj.pk else 0
        return sleep_status(obj, asleep)


@extend_schema_field({"type": "string", "pattern": SELECTOR_PATTERN, "maxLength": 1024})
class SelectorField(serializers.Field):
    """A label selector, checked as given (by EngineProfile.clean()): never trimmed into one.

    Its pattern in the schema is the grammar the API parses (fleet/selectors.py).
    Not a CharField: drf-spectacular would offer "" a second time beside the
    pattern, which already takes it, and a client would find the schema ambiguous.
    """

    default_error_messages = {
        "invalid": "Not a valid string.",
        "max_length": "Ensure this field has no more than 1024 characters.",
    }

    def __init__(self, **kwargs):
        kwargs.setdefault("help_text", "Label selector, e.g. 'gpu=h100,zone!=b,coding'.")
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        if len(data) > 1024:
            self.fail("max_length")
        return data

    def to_representation(self, value):
        return value


class EngineProfileSerializer(ValidatedModelSerializer):
    engine = serializers.ChoiceField(
        choices=Engine.choices,
        error_messages={
            "invalid_choice": (
                f"unknown engine '{{input}}'; choose one of {', '.join(Engine.values)}"
            )
        },
    )
    model_name = serializers.CharField(source="model.name", read_only=True)
    gpus_total = serializers.IntegerField(read_only=True)
    node_selector = SelectorField(required=False)
    # JSON in the database, but only these shapes are valid (EngineProfile.clean());
    # typed here, the schema says so and a generated client gets a list and a map.
    args = serializers.ListField(
        child=StrictCharField(
            allow_blank=True,
            trim_whitespace=False,
            error_messages={"invalid": "args must be a list of strings"},
        ),
        error_messages={"not_a_list": "args must be a list of strings, not {input_type}"},
        required=False,
        help_text="Extra engine arguments.",
    )
    env = serializers.DictField(
        child=StrictCharField(
            allow_blank=True,
            trim_whitespace=False,
            error_messages={"invalid": "env must map names to string values"},
        ),
        error_messages={"not_a_dict": "env must map names to string values, not {input_type}"},
        required=False,
        help_text="Extra environment variables.",
    )
    weights_sha256 = sha256_map("weights_sha256")

    class Meta:
        model = EngineProfile
        fields = (
            "id",
            "model",
            "model_name",
            "name",
            "engine",
            "gpu_class",
            "tp",
            "pp",
            "gpus_per_node",
            "gpu_memory_gb",
            "nodes",
            "gpus_total",
            "args",
            "env",
            "model_path",
            "weights_sha256",
            "served_model_name",
            "min_memory_gb",
            "context_tokens",
            "sequences",
            "estimate",
            "node_selector",
            "startup_timeout_s",
            "max_adapters",
            "args_env_changed_by",
            "args_env_changed_at",
            "created_at",
            "updated_at",
        )
        # The column sizes of PostgreSQL, said here so that SQLite (which has one
        # size) checks them too and the schema is the same on either.
        extra_kwargs = {
            **{
                name: {"max_value": SMALLINT_MAX} for name in ("tp", "pp", "gpus_per_node", "nodes")
            },
            **{
                name: {"max_value": INT_MAX}
                for name in ("min_memory_gb", "startup_timeout_s", "context_tokens")
            },
            "context_tokens": {"min_value": 1, "max_value": INT_MAX},
            "sequences": {"min_value": 1, "max_value": SMALLINT_MAX},
            "gpu_memory_gb": {"min_value": 0.001, "max_value": GPU_MEMORY_GB_MAX},
        }
        read_only_fields = (
            "estimate",
            "args_env_changed_by",
            "args_env_changed_at",
            "created_at",
            "updated_at",
        )

    def validate(self, attrs):
        # Before the model's rules: a caller who may not set args or env learns
        # that, not what else is wrong with them.
        if profiles.args_env_changes(self.instance, attrs.get("args"), attrs.get("env")):
            request = self.context.get("request")
            user = getattr(request, "user", None)
            if (why := profiles.args_env_refusal(user)) is not None:
                raise PermissionDenied(why)
            attrs.update(profiles.args_env_stamp(user))
        return super().validate(attrs)

    def validate_model(self, value):
        if self.instance is None and (
            why := teams.problem(actor_of(self), value.team_id, f"add a profile to model '{value}'")
        ):
            raise PermissionDenied(why)
        # A profile belongs to its model for life: replicas and the model's
        # active_profile point at it, and moving it would take them along.
        if self.instance is not None and value.pk != self.instance.model_id:
            raise serializers.ValidationError(
                f"profile '{self.instance.name}' belongs to model '{self.instance.model.name}'; "
                "create a new profile for another model"
            )
        return value


class CanaryWhySerializer(serializers.Serializer):
    why = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="Said in the event, e.g. 'p95 within bounds'.",
    )


class CanaryDoneSerializer(serializers.Serializer):
    detail = serializers.CharField()
    model = ModelSerializer()


class PlacedShardSerializer(serializers.Serializer):
    node = serializers.CharField()
    rank = serializers.IntegerField()
    gpus = serializers.ListField(child=serializers.CharField(), help_text="GPU UUIDs.")
    port = serializers.IntegerField()


class NodeVerdictSerializer(serializers.Serializer):
    node = serializers.CharField()
    fits = serializers.BooleanField()
    reason = serializers.CharField()


class ExplanationSerializer(serializers.Serializer):
    """What ``explain`` answers (fleet.services.snapshot.Explanation.as_dict): for the schema."""

    model = serializers.CharField()
    profile = serializers.CharField()
    summary = serializers.CharField(help_text="What the profile needs, in a line.")
    choice = serializers.CharField(help_text="Where a new replica would go, or why nowhere.")
    placement = PlacedShardSerializer(many=True, help_text="Empty when it cannot be placed.")
    nodes = NodeVerdictSerializer(many=True, help_text="Every node, and whether it fits.")


class CatalogApplySerializer(serializers.Serializer):
    catalog = StrictCharField(
        max_length=1 << 20, trim_whitespace=False, help_text="The catalog file's YAML text."
    )
    dry_run = StrictBooleanField(default=False, help_text="Say what would change only.")


class ApplyResultSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    changes = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.ListField(child=serializers.CharField())


class CatalogExplainSerializer(serializers.Serializer):
    model = StrictCharField(max_length=200)
    profile = StrictCharField(max_length=200, required=False, allow_blank=True)
    catalog = StrictCharField(
        max_length=1 << 20,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="A catalog file to consider applied first; nothing is saved.",
    )
