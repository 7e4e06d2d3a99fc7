"""How replicas, shards and events read through the API, and what evicting a replica answers.

Its one reason to change: a field of a replica, a shard or an event shown differently.
"""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.models import Event, Replica, Shard
from fleet.services.units import over_gpu_budget


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


class EvictedSerializer(serializers.Serializer):
    changed = serializers.BooleanField(help_text="False when it was asked already, or stopping.")
    detail = serializers.CharField(help_text="What happens next, or why nothing changed.")
    replica = ReplicaSerializer()
