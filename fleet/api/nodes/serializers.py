"""How nodes, GPUs and wanted engines read through the API, and the bodies their actions take.

Its one reason to change: a field of a node, a GPU or a wanted engine shown or taken
differently, or an action on them asking or answering something new.
"""

from django.core.validators import RegexValidator
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agentd.protocol import NOTICE_MAX_S
from fleet.models import (
    GPU,
    EngineInstall,
    FabricAttachment,
    GPUHealth,
    Node,
    NodeLoad,
    VllmBuild,
    WantedEngine,
)
from fleet.services import nodes as node_service

from ..common import StrictCharField, StrictFloatField, ValidatedModelSerializer


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


class RevokedSerializer(serializers.Serializer):
    node = serializers.CharField()
    revoked = serializers.IntegerField(help_text="Credentials revoked now (0: none was live).")
