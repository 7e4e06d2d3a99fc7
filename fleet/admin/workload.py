"""Replicas, shards and the reconciler's status: its and the agents' business, read-only."""

from django.contrib import admin

from fleet.models import FleetStatus, Replica, Shard

from .common import ReadOnlyAdmin, ReadOnlyTabularInline, human_bytes


def fetch_progress(shard: Shard) -> str:
    """'3.0 GB of 15.0 GB (20%)', '3.0 GB' when the total is unknown, '-' before any."""
    if shard.fetch_bytes_done is None:
        return "-"
    done = human_bytes(shard.fetch_bytes_done)
    if not shard.fetch_bytes_total:
        return done
    pct = 100 * shard.fetch_bytes_done / shard.fetch_bytes_total
    return f"{done} of {human_bytes(shard.fetch_bytes_total)} ({pct:.0f}%)"


class ReplicaShardInline(ReadOnlyTabularInline):
    model = Shard
    fk_name = "replica"
    fields = ("id", "node", "rank", "state", "desired_state", "port", "gpu_uuids", "error")
    readonly_fields = fields


@admin.register(Replica)
class ReplicaAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "model",
        "profile",
        "state",
        "reason",
        "restarts",
        "created_at",
        "updated_at",
    )
    list_filter = ("state", "model")
    search_fields = ("id", "model__name", "reason")
    list_select_related = ("model", "profile", "profile__model")
    inlines = (ReplicaShardInline,)


@admin.register(Shard)
class ShardAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "replica",
        "node",
        "rank",
        "state",
        "desired_state",
        "port",
        "exit_code",
        "fetch",
        "state_changed_at",
    )
    list_filter = ("state", "desired_state")
    search_fields = ("id", "node__id", "replica__id", "replica__model__name", "error")
    list_select_related = ("replica", "replica__model", "node")
    readonly_fields = ("fetch",)

    @admin.display(description="fetched")
    def fetch(self, obj):
        return fetch_progress(obj)


@admin.register(FleetStatus)
class FleetStatusAdmin(ReadOnlyAdmin):
    list_display = (
        "__str__",
        "last_pass_at",
        "last_pass_ms",
        "silent_nodes",
        "total_nodes",
        "replacement_paused",
        "message",
    )
