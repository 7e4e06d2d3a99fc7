"""GPUs and their health, and a node's notice of going away (docs/operations.md, "GPU
faults and notices"). Clearing a fault and giving notice go through
fleet.services.gpu_health, which checks ``gpu.clear`` and ``node.notice``."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME, ActionForm
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from agentd.ctl.times import notice_seconds
from agentd.protocol import NOTICE_MAX_S
from fleet.models import GPU, GPUHealth
from fleet.services import gpu_health, permissions
from fleet.services.console.lines import xids_text

from .common import ReadOnlyAdmin, ReadOnlyTabularInline


class GPUInline(ReadOnlyTabularInline):
    """The node page's GPUs; a fault is cleared from the GPUs list (its link)."""

    model = GPU
    fields = (
        "index",
        "name",
        "uuid",
        "health",
        "health_reason",
        "xids_display",
        "clear_link",
        "memory_used_mb",
        "memory_total_mb",
        "numa_node",
        "pci_bus_id",
        "temperature_c",
        "ecc_errors",
        "nvlink_peers",
        "problems",
    )
    readonly_fields = fields

    @admin.display(description="XIDs")
    def xids_display(self, obj):
        return xids_text(obj.xids) or "-"

    @admin.display(description="fault")
    def clear_link(self, obj):
        if obj.fault == GPUHealth.HEALTHY and obj.drained_at is None:
            return "-"
        url = reverse("admin:fleet_gpu_changelist") + f"?node__id__exact={obj.node_id}"
        return format_html('{} <a href="{}">clear…</a>', obj.fault_reason or obj.fault, url)


class GPUActionForm(ActionForm):
    """The GPUs list's action bar, with the reason a clear needs."""

    reason = forms.CharField(
        required=False,
        max_length=255,
        label="Reason",
        help_text="For 'Clear the fault': why it is fine again (kept in the audit trail).",
    )


@admin.register(GPU)
class GPUAdmin(ReadOnlyAdmin):
    list_display = (
        "__str__",
        "name",
        "health",
        "health_reason",
        "xids_display",
        "memory_used_mb",
        "memory_total_mb",
        "temperature_c",
        "ecc_errors",
        "pci_bus_id",
    )
    list_filter = ("health", "fault", "name", "driver_version", "cuda_version")
    search_fields = ("node__id", "uuid", "name", "pci_bus_id")
    list_select_related = ("node",)
    action_form = GPUActionForm
    actions = ("clear_faults",)

    # The action's permission, from the one table every door asks (fleet.services.permissions).
    def has_clear_permission(self, request, obj=None):
        return permissions.allowed(request.user, "gpu.clear")

    @admin.display(description="XIDs")
    def xids_display(self, obj):
        return xids_text(obj.xids) or "-"

    @admin.action(
        description="Clear the fault (the reason beside): placed on again",
        permissions=["clear"],
    )
    def clear_faults(self, request, queryset):
        reason = request.POST.get("reason", "")
        done = []
        for gpu in queryset:
            try:
                changed, text = gpu_health.clear(gpu, request.user, reason)
            except (ValueError, permissions.Refused) as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return
            if changed:
                done.append(text)
            else:
                self.message_user(request, text, messages.INFO)
        for text in done:
            self.message_user(request, text, messages.SUCCESS)


class NoticeForm(forms.Form):
    notice_in = forms.CharField(
        label="Goes away in",
        max_length=20,
        help_text="120 (seconds), 120s, 2m or 1h from now.",
    )
    reason = forms.CharField(
        required=False, max_length=255, help_text="Shown on the node page and in the event."
    )

    def clean_notice_in(self):
        try:
            seconds = notice_seconds(self.cleaned_data["notice_in"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc).replace("--in ", "")) from None
        if seconds > NOTICE_MAX_S:
            raise forms.ValidationError(f"a notice is 0 to {NOTICE_MAX_S} s (a week) ahead")
        return seconds


@admin.action(description="Give notice: it goes away in … (drains now)", permissions=["notice"])
def give_notice(modeladmin, request, queryset):
    """An intermediate page asks when and why; its post gives each node notice."""
    form = NoticeForm(request.POST if "apply" in request.POST else None)
    if form.is_bound and form.is_valid():
        for node in queryset:
            try:
                text = gpu_health.give_notice(
                    node,
                    form.cleaned_data["notice_in"],
                    "operator",
                    form.cleaned_data["reason"],
                    request.user,
                )
            except (ValueError, permissions.Refused) as exc:
                modeladmin.message_user(request, str(exc), messages.ERROR)
                return None
            modeladmin.message_user(request, text, messages.WARNING)
        return None
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "opts": opts,
        "title": "Give notice",
        "nodes": list(queryset),
        "form": form,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "changelist_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"),
    }
    return TemplateResponse(request, "admin/fleet/node_notice.html", context)
