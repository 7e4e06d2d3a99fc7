"""Serializers for the management API.

Writable serializers run the model's full_clean(), so a rule in Model.clean()
holds the same through the API as in the admin, field by field.
"""

from copy import copy

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.settings import api_settings

from agentd.protocol import NOTICE_MAX_S
from fleet.models import (
    GPU,
    Adapter,
    ApiKey,
    Engine,
    EngineInstall,
    EngineProfile,
    Event,
    FabricAttachment,
    GPUHealth,
    Model,
    Node,
    NodeLoad,
    Replica,
    ReplicaState,
    Shard,
    Team,
    VllmBuild,
    WantedEngine,
)
from fleet.models.catalog import PRIORITY_MAX
from fleet.models.profiles import GPU_MEMORY_GB_MAX
from fleet.selectors import SELECTOR_PATTERN
from fleet.services import adapters, profiles, reach, teams
from fleet.services import nodes as node_service
from fleet.services.autoscaler.status import scaling_status, sleep_status
from fleet.services.permissions import Refused
from fleet.services.units import over_gpu_budget

SMALLINT_MAX = 32767
INT_MAX = 2**31 - 1


class StrictCharField(serializers.CharField):
    """Text, and only text, checked as given.

    DRF's CharField takes ``0`` or ``1.5`` and stores "0", "1.5", and trims
    blanks first, so "  " sent for a field the schema says is non-empty (as it
    is) came back "may not be blank". The schema says string; a client sending
    a number has a bug worth hearing about.
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A number, as JSON says it: DRF's FloatField takes ``true`` as 1.0 and "0.5"."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictDecimalField(serializers.DecimalField):
    """An amount as text ("2.50"), as the schema says and as the API answers it: DRF's
    DecimalField also takes the number 2.5, which a client reading the schema would not
    send, and JSON numbers lose cents to binary fractions."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class NameRelatedField(serializers.SlugRelatedField):
    """A row by its name, as a string (DRF would find the group "0" for 0), or null
    where allowed; "" is neither (DRF would take it as null)."""

    def run_validation(self, data=serializers.empty):
        if data == "":
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        return super().run_validation(data)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """true or false, as JSON says them.

    DRF's BooleanField also takes 0, 1, "yes", "off" and more; the schema says
    boolean, and a client sending 0 has a bug worth hearing about.
    """

    def to_internal_value(self, data):
        if data is True or data is False:
            return data
        self.fail("invalid", input=data)


class ValidatedModelSerializer(serializers.ModelSerializer):
    """Validates through the model's full_clean(), after DRF's own field checks."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: StrictCharField,
        models.TextField: StrictCharField,
        models.BooleanField: StrictBooleanField,
        models.FloatField: StrictFloatField,
        models.DecimalField: StrictDecimalField,
    }

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if self.instance is None:
            instance = self.Meta.model(**attrs)
        else:
            instance = copy(self.instance)
            for name, value in attrs.items():
                setattr(instance, name, value)
        try:
            # Uniqueness is checked by DRF's validators already, and again by the database.
            instance.full_clean(validate_unique=False, validate_constraints=False)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(_field_errors(exc)) from None
        return attrs


def fallbacks_field(owner):
    """A list of model names, in order: a model's fallbacks, or an API key's."""
    return serializers.ListField(
        child=StrictCharField(
            max_length=128, error_messages={"invalid": "fallbacks must be a list of model names"}
        ),
        error_messages={"not_a_list": "fallbacks must be a list of model names, not {input_type}"},
        required=False,
        help_text=owner._meta.get_field("fallbacks").help_text,
    )


def _field_errors(exc: DjangoValidationError) -> dict:
    if not hasattr(exc, "error_dict"):
        return {api_settings.NON_FIELD_ERRORS_KEY: exc.messages}
    return {
        (api_settings.NON_FIELD_ERRORS_KEY if field == "__all__" else field): msgs
        for field, msgs in exc.message_dict.items()
    }


class GPUSerializer(serializers.ModelSerializer):
    healthy = serializers.SerializerMethodField(
        help_text="No problems and health healthy: placement takes it."
    )

    class Meta:
        model = GPU
        fields = (
            "id",
            "node",
            "index",
            "uuid",
            "name",
            "memory_total_mb",
            "memory_used_mb",
            "compute_capability",
            "numa_node",
            "pci_bus_id",
            "driver_version",
            "cuda_version",
            "nvlink_peers",
            "ecc_errors",
            "temperature_c",
            "problems",
            "healthy",
            "health",
            "health_reason",
            "fault",
            "fault_reason",
            "fault_at",
            "slowdowns",
            "xids",
            "drained_at",
        )
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_healthy(self, obj) -> bool:
        # What placement takes (fleet.services.snapshot): no problem, and healthy.
        return obj.healthy and obj.health == GPUHealth.HEALTHY


class FabricSerializer(serializers.ModelSerializer):
    class Meta:
        model = FabricAttachment
        fields = ("fabric", "hcas", "rate_gbps")
        read_only_fields = fields


class EngineInstallSerializer(serializers.ModelSerializer):
    class Meta:
        model = EngineInstall
        fields = ("engine", "version", "variant", "state", "progress_percent", "detail")
        read_only_fields = fields


class NodeLoadSerializer(serializers.ModelSerializer):
    class Meta:
        model = NodeLoad
        fields = (
            "sampled_at",
            "cpu_percent",
            "cpu_count",
            "load1",
            "load5",
            "load15",
            "memory_used_bytes",
            "memory_available_bytes",
        )
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    labels = serializers.DictField(child=serializers.CharField(), read_only=True)
    gpus = GPUSerializer(many=True, read_only=True)
    fabrics = FabricSerializer(many=True, read_only=True)
    engine_installs = EngineInstallSerializer(many=True, read_only=True)
    load = serializers.SerializerMethodField(
        help_text="The latest load sample; null when none arrived in the last minute."
    )
    not_keeping_up = serializers.SerializerMethodField(
        help_text="Connected, and its acknowledged desired version behind the desired one "
        "without progress for longer than LLMGW_DESIRED_LAG_BOUND_S."
    )

    class Meta:
        model = Node
        fields = (
            "id",
            "hostname",
            "mgmt_addr",
            "mgmt_interface",
            "state",
            "cordoned",
            "draining",
            "notice_deadline",
            "notice_source",
            "notice_reason",
            "vllm_build",
            "connected",
            "last_seen",
            "registered_at",
            "agent_version",
            "engine_versions",
            "memory_total_mb",
            "agent_labels",
            "operator_labels",
            "labels",
            "desired_version",
            "acked_version",
            "desired_lag_since",
            "not_keeping_up",
            "gpus",
            "fabrics",
            "engine_installs",
            "load",
        )
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_not_keeping_up(self, obj) -> bool:
        return node_service.node_not_keeping_up(obj, self.context.get("now") or timezone.now())

    @extend_schema_field(NodeLoadSerializer(allow_null=True))
    def get_load(self, obj):
        load = node_service.fresh_load(obj, self.context.get("now") or timezone.now())
        return NodeLoadSerializer(load).data if load else None


class VllmBuildSerializer(serializers.Serializer):
    vllm_build = serializers.ChoiceField(
        choices=VllmBuild.choices,
        help_text="auto: from the driver's CUDA version (cpu on a node without a GPU); "
        "cu13; cu129; cpu; none: not installed.",
        error_messages={
            "invalid_choice": (
                f"'{{input}}' is not a vLLM build; one of {', '.join(VllmBuild.values)}"
            )
        },
    )


class WantedEngineSerializer(ValidatedModelSerializer):
    class Meta:
        model = WantedEngine
        fields = ("id", "engine", "version", "updated_at")
        read_only_fields = ("updated_at",)


def _actor(serializer):
    return getattr(serializer.context.get("request"), "user", None)


def team_field(owner):
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
        actor = _actor(self)
        try:
            if self.instance is None:
                name = attrs.get("name", "")
                attrs["team"] = teams.team_for_new(actor, attrs.get("team"), f"model '{name}'")
            elif "team" in attrs and attrs["team"] != self.instance.team:
                teams.team_for_new(actor, attrs["team"], f"model '{self.instance.name}'")
        except Refused as exc:
            raise PermissionDenied(str(exc)) from None
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


class EventSerializer(serializers.ModelSerializer):
    node = serializers.CharField(
        source="node_id", read_only=True, help_text="The node it concerns; empty if none."
    )

    class Meta:
        model = Event
        fields = (
            "id",
            "created_at",
            "kind",
            "model",
            "model_name",
            "node",
            "direction",
            "from_replicas",
            "to_replicas",
            "reason",
        )
        read_only_fields = fields


@extend_schema_field(
    {
        "type": "object",
        "maxProperties": 4096,
        "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    }
)
class Sha256MapField(serializers.DictField):
    """File name -> sha256, as the schema says it: 64 lowercase hex digits each."""


def sha256_map(name: str) -> Sha256MapField:
    """Checksums of the files a node fetches (a profile's weights, an adapter's)."""
    wrong = f"{name} must map file names to sha256 hex digests"
    return Sha256MapField(
        child=StrictCharField(trim_whitespace=False, error_messages={"invalid": wrong}),
        error_messages={"not_a_dict": wrong + ", not {input_type}"},
        required=False,
        help_text='Optional checksums of fetched files: {"file name": "64 lowercase hex digits"}.',
    )


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
            why := teams.problem(_actor(self), value.team_id, f"add a profile to model '{value}'")
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


class AdapterPlaceSerializer(serializers.Serializer):
    replica = serializers.CharField()
    node = serializers.CharField()
    state = serializers.CharField(help_text="loading, loaded or failed")
    error = serializers.CharField(help_text="The engine's reason, where it failed.")


class AdapterSerializer(ValidatedModelSerializer):
    model_name = serializers.CharField(source="model.name", read_only=True)
    sha256 = sha256_map("sha256")
    loaded = serializers.SerializerMethodField(help_text="Where its base model's replicas hold it.")

    class Meta:
        model = Adapter
        fields = (
            "id",
            "name",
            "model",
            "model_name",
            "description",
            "source",
            "sha256",
            "rank",
            "loaded",
            "last_request_at",
            "created_at",
            "updated_at",
        )
        extra_kwargs = {"rank": {"max_value": SMALLINT_MAX}}
        read_only_fields = ("last_request_at", "created_at", "updated_at")

    @extend_schema_field(AdapterPlaceSerializer(many=True))
    def get_loaded(self, obj) -> list:
        return [
            {"replica": r, "node": n, "state": s, "error": e} for r, n, s, e in adapters.where(obj)
        ]

    def validate_model(self, value):
        if why := teams.problem(_actor(self), value.team_id, f"add an adapter to model '{value}'"):
            raise PermissionDenied(why)
        return value


class ShardSerializer(serializers.ModelSerializer):
    fetch_percent = serializers.SerializerMethodField(
        help_text="Share of the weights fetched (0-100); null when no fetch or no known total."
    )
    gpu_memory_budget_gb = serializers.FloatField(
        read_only=True,
        allow_null=True,
        help_text="GPU memory this shard may use on each of its GPUs (its profile's "
        "gpu_memory_gb); null: whole GPUs.",
    )
    gpu_memory_used_mb = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="MiB its processes hold on the GPU where they hold the most, from the "
        "node's latest sample (NVML); null: not measured in the last minute.",
    )
    over_gpu_budget = serializers.SerializerMethodField(
        help_text="Whether it holds more GPU memory than its budget."
    )

    def get_over_gpu_budget(self, obj) -> bool:
        return over_gpu_budget(obj.gpu_memory_used_mb, obj.gpu_memory_budget_gb)

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_fetch_percent(self, obj) -> int | None:
        if obj.fetch_bytes_done is None or not obj.fetch_bytes_total:
            return None
        return min(100, obj.fetch_bytes_done * 100 // obj.fetch_bytes_total)

    class Meta:
        model = Shard
        fields = (
            "id",
            "replica",
            "node",
            "rank",
            "gpu_uuids",
            "hcas",
            "port",
            "desired_state",
            "state",
            "error",
            "exit_code",
            "last_output",
            "fetch_source",
            "fetch_bytes_done",
            "fetch_bytes_total",
            "fetch_percent",
            "fetch_updated_at",
            "gpu_memory_budget_gb",
            "gpu_memory_used_mb",
            "over_gpu_budget",
            "state_changed_at",
            "created_at",
        )
        read_only_fields = fields


class ReplicaSerializer(serializers.ModelSerializer):
    model_name = serializers.CharField(source="model.name", read_only=True)
    shards = ShardSerializer(many=True, read_only=True)

    class Meta:
        model = Replica
        fields = (
            "id",
            "model",
            "model_name",
            "profile",
            "state",
            "reason",
            "restarts",
            "preempted_by",
            "evict",
            "evict_at",
            "evict_by",
            "shards",
            "created_at",
            "updated_at",
        )
        read_only_fields = fields


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


# Free text that says something: the schema's pattern, so blanks are refused as it says.
SAYS_SOMETHING = r"\S"


class GPUClearSerializer(serializers.Serializer):
    reason = StrictCharField(
        max_length=255,
        validators=[
            RegexValidator(
                SAYS_SOMETHING, "say why the GPU is fine again: the audit trail keeps it"
            )
        ],
        help_text="Why it is fine again (reset, swapped, the driver's fault): the audit "
        "trail and the event keep it.",
    )


class GPUClearedSerializer(serializers.Serializer):
    changed = serializers.BooleanField(help_text="False when it had no fault to clear.")
    detail = serializers.CharField(help_text="What was cleared and its health now.")
    gpu = GPUSerializer()


class NodeNoticeSerializer(serializers.Serializer):
    in_s = StrictFloatField(
        min_value=0,
        max_value=NOTICE_MAX_S,
        help_text="Seconds until the node goes away, from now.",
        error_messages={
            "min_value": f"a notice is 0 to {NOTICE_MAX_S} s ahead, not in the past",
            "max_value": f"a notice is 0 to {NOTICE_MAX_S} s (a week) ahead, not more",
        },
    )
    reason = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=255,
        help_text="Said on the node page and in the event, e.g. 'spot reclaim'.",
    )


class NoticeGivenSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="What happens, or the notice it had already.")
    node = NodeSerializer()


class EvictedSerializer(serializers.Serializer):
    changed = serializers.BooleanField(help_text="False when it was asked already, or stopping.")
    detail = serializers.CharField(help_text="What happens next, or why nothing changed.")
    replica = ReplicaSerializer()


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


class NodeRowSerializer(serializers.Serializer):
    """One row of the node table; "-" where the node never said."""

    node = serializers.CharField()
    state = serializers.CharField(help_text="State, with intent appended: 'ready,cordoned'.")
    cpu_percent = serializers.CharField()
    memory_gb = serializers.CharField()
    gpus = serializers.CharField()
    engines = serializers.CharField()
    shards = serializers.CharField(help_text="Ready/all.")
    vllm_build = serializers.CharField(help_text="auto, cu13, cu129, cpu or none.")
    installs = serializers.CharField(help_text="Each wanted engine's install state; '-': none.")


class NodeLogsSerializer(serializers.Serializer):
    node = serializers.CharField()
    source = serializers.CharField()
    lines = serializers.ListField(child=serializers.CharField())
    sources = serializers.ListField(child=serializers.CharField(), help_text="What else it has.")
    error = serializers.CharField(allow_blank=True, help_text="The node's own refusal, if any.")


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


class RevokedSerializer(serializers.Serializer):
    node = serializers.CharField()
    revoked = serializers.IntegerField(help_text="Credentials revoked now (0: none was live).")


class JoinTokenRequestSerializer(serializers.Serializer):
    name = StrictCharField(max_length=100, help_text="What it is for, e.g. 'rack 4'.")
    ttl = StrictCharField(default="24h", max_length=20, help_text="30m, 24h, 7d…")
    uses = serializers.IntegerField(default=1, min_value=1, max_value=100_000)


# The columns' ranges: a larger number is a 400 naming the field, not a database error.
_INT_MAX = 2**31 - 1
_BIGINT_MAX = 2**63 - 1


class ApiKeyLimitsSerializer(serializers.Serializer):
    requests_per_minute = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=_INT_MAX,
        help_text="0: none; null: the default.",
    )
    tokens_per_minute = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=_INT_MAX
    )
    tokens_per_day = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=_BIGINT_MAX
    )
    tokens_per_month = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=_BIGINT_MAX
    )
    max_concurrent = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=_INT_MAX,
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


class WeightsSerializer(serializers.Serializer):
    """A weights entry on a node, with what uses it now (``weights_gc.inventory.Item``)."""

    id = serializers.IntegerField(read_only=True)
    node = serializers.CharField(read_only=True)
    path = serializers.CharField(read_only=True)
    source = serializers.CharField(
        read_only=True, help_text="The model_path it was fetched from; empty: found on disk."
    )
    size_bytes = serializers.IntegerField(read_only=True)
    shared = serializers.BooleanField(read_only=True)
    pinned = serializers.BooleanField(read_only=True, help_text="Never removed by the clean-up.")
    last_used_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="When an engine last used it, by the node."
    )
    unused_since = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="Since when nothing on the node needs it, as the clean-up saw; null: in use.",
    )
    in_use_by = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Shards that need it now, as 'model (shard id)'.",
    )
    removal = serializers.ChoiceField(
        choices=["", "proposed", "sent"], read_only=True, help_text="A removal under way."
    )
    kept_reason = serializers.CharField(
        read_only=True, help_text="Why the node kept it the last time it was proposed."
    )

    def to_representation(self, instance):
        return instance.as_dict()


class WeightsProposalSerializer(serializers.Serializer):
    node = serializers.CharField()
    path = serializers.CharField()
    size_bytes = serializers.IntegerField()
    reason = serializers.CharField()


class WeightsCleanupSerializer(serializers.Serializer):
    """What a clean-up pass proposes (or, for GET, would propose) and what it refused."""

    proposals = WeightsProposalSerializer(many=True)
    refused = WeightsProposalSerializer(many=True, help_text="Asked for, and kept: why.")
    waiting = WeightsProposalSerializer(
        many=True,
        help_text="Asked for, and left for a later pass: why not now (a removal already "
        "under way, the node not connected). The request stands.",
    )
    skipped = serializers.BooleanField(
        help_text="A reconciler pass held the lock: nothing was done; try again."
    )

    def to_representation(self, report):
        def one(e, reason):
            return {"node": e.node_id, "path": e.path, "size_bytes": e.size_bytes, "reason": reason}

        return {
            "proposals": [one(p.entry, p.reason) for p in report.proposals],
            "refused": [one(e, why) for e, why in report.refused],
            "waiting": [one(e, why) for e, why in report.waiting],
            "skipped": report.skipped,
        }


class AuditEntrySerializer(serializers.Serializer):
    """One change, as the audit trail keeps it (fleet/audit.py)."""

    id = serializers.IntegerField()
    timestamp = serializers.DateTimeField()
    action = serializers.SerializerMethodField(help_text="create, update or delete.")
    object_type = serializers.CharField(source="content_type.model")
    object = serializers.CharField(source="object_pk", help_text="The object's id.")
    object_repr = serializers.CharField(help_text="The object as it read when changed.")
    actor = serializers.SerializerMethodField(help_text="The user; null: the system itself.")
    door = serializers.SerializerMethodField(
        help_text="admin, console, api, llmgw, manage.py <command> or system."
    )
    remote_addr = serializers.IPAddressField(allow_null=True)
    changes = serializers.SerializerMethodField(
        help_text="{field: [before, after]}; secrets are never recorded."
    )
    detail = serializers.JSONField(
        source="additional_data", help_text="The request, the client, the shell's user …"
    )

    def get_action(self, entry) -> str:
        return {0: "create", 1: "update", 2: "delete"}.get(entry.action, str(entry.action))

    def get_actor(self, entry) -> str | None:
        return entry.actor.get_username() if entry.actor_id else None

    def get_door(self, entry) -> str:
        return (entry.additional_data or {}).get("door", "system")

    def get_changes(self, entry) -> dict:
        return entry.changes_dict


class TeamSerializer(ValidatedModelSerializer):
    group = NameRelatedField(
        slug_field="name",
        queryset=Group.objects.all(),
        required=False,
        help_text="The Django group whose users are its members. Left out of a new team: "
        "a group of the team's name, made if there is none.",
    )
    members = serializers.SerializerMethodField(help_text="Its members' user names.")
    in_use = serializers.SerializerMethodField(
        help_text="What it holds now: GPUs, GPU memory (GB), replicas placed, and tokens "
        "its keys used this UTC month."
    )

    class Meta:
        model = Team
        fields = (
            "id",
            "name",
            "description",
            "group",
            "members",
            "max_gpus",
            "max_gpu_memory_gb",
            "max_replicas",
            "tokens_per_month",
            "max_priority",
            "guaranteed_gpu_memory_gb",
            "budget_per_month",
            "budget_currency",
            "budget_warn_percent",
            "spent_this_month",
            "budget_spent_at",
            "in_use",
            "created_at",
        )
        read_only_fields = ("created_at", "spent_this_month", "budget_spent_at")
        extra_kwargs = {
            "max_gpus": {"max_value": INT_MAX},
            "max_gpu_memory_gb": {"max_value": INT_MAX},
            "guaranteed_gpu_memory_gb": {"max_value": INT_MAX},
            "max_priority": {"min_value": 0, "max_value": PRIORITY_MAX},
            "max_replicas": {"max_value": INT_MAX},
            "tokens_per_month": {"max_value": 2**63 - 1},
            "budget_warn_percent": {"min_value": 1, "max_value": 100},
        }

    def validate(self, attrs):
        if self.instance is None and "group" not in attrs and attrs.get("name"):
            group = Group.objects.filter(name=attrs["name"]).first()
            attrs["group"] = group or Group(name=attrs["name"])
        group = attrs.get("group")
        if group is not None and group.pk is not None:
            other = Team.objects.filter(group=group).exclude(
                pk=self.instance.pk if self.instance else None
            )
            if other.exists():
                raise serializers.ValidationError(
                    {"group": [f"group '{group.name}' is team '{other.first().name}' already"]}
                )
        # The fields' own validators have run (DRF's, from the model's); full_clean()
        # would refuse a group not made yet, which create() makes: clean() is asked alone.
        attrs = serializers.ModelSerializer.validate(self, attrs)
        probe = copy(self.instance) if self.instance is not None else Team()
        for name, value in attrs.items():
            if name != "group":
                setattr(probe, name, value)
        if why := reach.team_capacity_problem(_actor(self), probe, self.instance):
            raise PermissionDenied(why)
        try:
            probe.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(_field_errors(exc)) from None
        return attrs

    def create(self, validated_data):
        group = validated_data["group"]
        if group.pk is None:
            group.save()
        return super().create(validated_data)

    def get_members(self, obj) -> list[str]:
        return sorted(obj.group.user_set.values_list("username", flat=True))

    @extend_schema_field(
        {
            "type": "object",
            "properties": {
                "gpus": {"type": "integer"},
                "gpu_memory_gb": {"type": "number"},
                "replicas": {"type": "integer"},
                "tokens_this_month": {"type": "integer"},
            },
        }
    )
    def get_in_use(self, obj) -> dict:
        use = self.context.get("team_use")
        if use is None:
            use = self.context["team_use"] = teams.in_use()
        return use.get(obj.pk, teams.NOTHING_IN_USE)
