"""The Batch API's batches and files: read-only, with each batch's progress.

Clients create, cancel and delete through /v1/batches and /v1/files with their
API keys (docs/gateway.md, "Batch API"); operators watch here and on the
console's Batches page. Both show an operator only what their teams own (all of
it with ``fleet.manage_all_teams``): a batch holds its team's prompts and answers.
"""

from django.contrib import admin

from fleet.models import Batch, BatchFile, BatchLine
from fleet.services.batches.owners import seen_by
from fleet.services.console.batches import owner_text, progress_text

from .common import ReadOnlyAdmin, human_bytes


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "owner",
        "endpoint",
        "status",
        "progress",
        "paused",
        "created_at",
        "expires_at",
    )
    list_filter = ("status", "endpoint", "team")
    search_fields = ("id", "api_key__name", "api_key__prefix", "input_file__id")
    list_select_related = ("team", "api_key")
    readonly_fields = (
        "id",
        "owner",
        "api_key",
        "endpoint",
        "completion_window",
        "status",
        "progress",
        "paused",
        "input_file_id",
        "output_file_id",
        "error_file_id",
        "errors",
        "metadata",
        "created_at",
        "in_progress_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
        "expires_at",
    )
    fields = readonly_fields

    def get_queryset(self, request):
        return seen_by(super().get_queryset(request), request.user)

    @admin.display(description="owner")
    def owner(self, obj):
        return owner_text(obj)

    @admin.display(description="progress")
    def progress(self, obj):
        """'15 of 20 answered (1 failed)'."""
        return progress_text(obj.total, obj.completed, obj.failed)


@admin.register(BatchFile)
class BatchFileAdmin(ReadOnlyAdmin):
    list_display = ("id", "filename", "purpose", "size", "lines", "owner", "created_at")
    list_filter = ("purpose", "team")
    search_fields = ("id", "filename", "api_key__name")
    list_select_related = ("team", "api_key")
    readonly_fields = (
        "id",
        "filename",
        "purpose",
        "size",
        "lines",
        "owner",
        "api_key",
        "storage_name",
        "created_at",
    )
    fields = readonly_fields

    def get_queryset(self, request):
        return seen_by(super().get_queryset(request), request.user)

    @admin.display(description="owner")
    def owner(self, obj):
        return owner_text(obj)

    @admin.display(description="size", ordering="size_bytes")
    def size(self, obj):
        return human_bytes(obj.size_bytes)


@admin.register(BatchLine)
class BatchLineAdmin(ReadOnlyAdmin):
    """The answers of running batches, one per line; gone into the files once a batch ends."""

    list_display = ("batch", "line", "custom_id", "status_code", "error_code", "created_at")
    list_filter = ("status_code",)
    search_fields = ("batch__id", "custom_id")
    readonly_fields = (
        "batch",
        "line",
        "custom_id",
        "status_code",
        "body",
        "error_code",
        "error_message",
        "created_at",
    )
    fields = readonly_fields

    def get_queryset(self, request):
        return seen_by(super().get_queryset(request), request.user, prefix="batch__")
