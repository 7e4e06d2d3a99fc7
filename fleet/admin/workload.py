"""Replicas, shards and the reconciler's status: its and the agents' business, read-only."""

from django.contrib import admin, messages

from fleet.models import FleetStatus, Replica, Shard
from fleet.services import drain as drain_service
from fleet.services import permissions
from fleet.services.console.lines import fetch_progress_text

from .common import ReadOnlyAdmin, ReadOnlyTabularInline


def fetch_progress(shard: Shard) -> str:
    """'3.0 GiB of 15.0 GiB (20%)', '3.0 GiB' when the total is unknown, '-' before any."""
    return fetch_progress_text(shard.fetch_bytes_done, shard.fetch_bytes_total)


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
        "state_changed_at",
        "reason",
        "restarts",
        "evict",
        "created_at",
        "updated_at",
    )
    list_filter = ("state", "model")
    search_fields = ("id", "model__name", "reason")
    list_select_related = ("model", "profile", "profile__model")
    inlines = (ReplicaShardInline,)
    actions = ("drain_replicas", "stop_replicas", "restart_replicas")

    # The actions' permission, from the one table every door asks (fleet.services.permissions).
    def has_drain_permission(self, request, obj=None):
        return permissions.allowed(request.user, "replica.drain")

    def _evict(self, request, queryset, how: str) -> None:
        for replica in queryset:
            changed, text = drain_service.evict_replica(replica, how, request.user)
            self.message_user(request, text, messages.SUCCESS if changed else messages.INFO)

    @admin.action(
        description="Drain: a replacement first, then drain and stop", permissions=["drain"]
    )
    def drain_replicas(self, request, queryset):
        self._evict(request, queryset, "drain")

    @admin.action(description="Stop: drain now; the model wants one fewer", permissions=["drain"])
    def stop_replicas(self, request, queryset):
        self._evict(request, queryset, "stop")

    @admin.action(description="Restart: drain now; a new replica at once", permissions=["drain"])
    def restart_replicas(self, request, queryset):
        self._evict(request, queryset, "restart")


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
