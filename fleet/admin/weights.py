"""Weights on nodes: what is there, what uses it, and the clean-up's events.

Operators pin and unpin entries and ask for one to go now; a removal still
goes through the clean-up's rules (unused, not pinned) and the node's own
re-check, so "remove now" cannot take weights a shard needs.
"""

import threading

from django.contrib import admin

from fleet.models import LocalWeights, WeightsEvent
from fleet.services import permissions
from fleet.services.weights_gc import inventory as weights_inventory

from .common import ReadOnlyAdmin, human_bytes


@admin.register(LocalWeights)
class LocalWeightsAdmin(ReadOnlyAdmin):
    list_display = (
        "node",
        "path",
        "size",
        "last_used",
        "in_use_by",
        "pinned",
        "removal",
        "kept_reason",
    )
    list_filter = ("pinned", "shared", "removal")
    search_fields = ("node__id", "path", "source")
    actions = ("remove_now", "pin", "unpin")
    readonly_fields = (
        "node",
        "path",
        "size",
        "source",
        "shared",
        "last_used_at",
        "unused_since",
        "in_use_by",
        "pinned",
        "removal",
        "removal_reason",
        "kept_at",
        "kept_reason",
    )
    fields = readonly_fields

    # The admin is one object for every request: the page's computed items are
    # kept per thread, so two operators' pages never mix.
    _page = threading.local()

    def get_changelist_instance(self, request):
        cl = super().get_changelist_instance(request)
        # What uses each entry is computed from the shards, once for the page.
        self._page.items = {i.row.pk: i for i in weights_inventory.annotate(cl.result_list)}
        return cl

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        if hasattr(response, "add_post_render_callback"):
            response.add_post_render_callback(lambda r: self._page.__dict__.clear())
        else:
            self._page.__dict__.clear()
        return response

    def _item(self, obj):
        cached = getattr(self._page, "items", {}).get(obj.pk)
        return cached if cached is not None else weights_inventory.annotate([obj])[0]

    def has_manage_permission(self, request, obj=None):
        # pin, unpin and remove: one rule in fleet.services.permissions, as the API's.
        return all(
            permissions.allowed(request.user, f"weights.{a}") for a in ("pin", "unpin", "remove")
        )

    @admin.display(description="size", ordering="size_bytes")
    def size(self, obj):
        return human_bytes(obj.size_bytes)

    @admin.display(description="last used")
    def last_used(self, obj):
        return self._item(obj).last_used_text

    @admin.display(description="in use by")
    def in_use_by(self, obj):
        return ", ".join(self._item(obj).used_by) or "-"

    @admin.action(
        description="Remove now (if unused; the node checks again)", permissions=["manage"]
    )
    def remove_now(self, request, queryset):
        report = weights_inventory.request_removal(list(queryset.values_list("pk", flat=True)))
        if report.skipped:
            self.message_user(request, "a reconciler pass is running: try again in a moment")
            return
        text = f"proposed {len(report.proposals)} for removal; each node checks again"
        if report.refused:
            text += "; kept " + "; ".join(f"{e.path}: {why}" for e, why in report.refused)
        if report.waiting:
            text += "; not yet " + "; ".join(f"{e.path}: {why}" for e, why in report.waiting)
        self.message_user(request, text)

    @admin.action(description="Pin: never remove", permissions=["manage"])
    def pin(self, request, queryset):
        done = weights_inventory.set_pinned(queryset.values_list("pk", flat=True), True)
        self.message_user(request, f"pinned {done} entr{'y' if done == 1 else 'ies'}")

    @admin.action(description="Unpin", permissions=["manage"])
    def unpin(self, request, queryset):
        done = weights_inventory.set_pinned(queryset.values_list("pk", flat=True), False)
        self.message_user(request, f"unpinned {done} entr{'y' if done == 1 else 'ies'}")


@admin.register(WeightsEvent)
class WeightsEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "node", "path", "action", "size", "reason")
    list_filter = ("action",)
    search_fields = ("node__id", "path", "reason", "request_id")
    date_hierarchy = "at"

    @admin.display(description="size", ordering="size_bytes")
    def size(self, obj):
        return human_bytes(obj.size_bytes)
