"""Prices per GPU class, with their history, and the cost hours they price.

A price is never edited: a change is a new price from its date on, made
through ``costs.set_price`` with the one permission check every door asks
("price.set"). Each price's page lists its class's history, and the list says
which price is in force now. Cost hours are derived (the accrual's) and
read-only, narrowed to the teams a user may see (``services.cost_scope``), as
the cost page is.
"""

from contextvars import ContextVar

from django import forms
from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from fleet.models import CostHour, Price
from fleet.services import cost_scope, costs, permissions, price_history

from .common import ReadOnlyAdmin, rendered_with

# Which price of each class is in force, worked out once for a list page's rows.
_IN_FORCE: ContextVar[dict | None] = ContextVar("prices_in_force", default=None)


class PriceForm(forms.ModelForm):
    class Meta:
        model = Price
        fields = ("gpu_class", "per_hour", "currency", "effective_from")

    def _get_validation_exclusions(self):
        # A price of a class and date already priced replaces that one, as through the
        # API and a catalog file (costs.set_price): the one way to correct a typo. Leaving
        # the date out of the model's checks leaves out its unique constraint; the form's
        # field has checked the date itself.
        return {*super()._get_validation_exclusions(), "effective_from"}


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    form = PriceForm
    list_display = (
        "class_display",
        "per_hour",
        "currency",
        "effective_from",
        "in_force",
        "created_at",
    )
    list_filter = ("currency",)
    search_fields = ("gpu_class",)
    date_hierarchy = "effective_from"
    fields = ("gpu_class", "per_hour", "currency", "effective_from")

    def has_add_permission(self, request):
        return permissions.allowed(request.user, "price.set")

    # History: a price once set is what its hours were priced at.
    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_fields(self, request, obj=None):
        return self.fields if obj is None else (*self.fields, "history")

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else (*self.fields, "history")

    def save_model(self, request, obj, form, change):
        price = costs.set_price(
            obj.gpu_class,
            obj.per_hour,
            obj.currency,
            obj.effective_from,
            actor=request.user,
        )
        obj.pk, obj.created_at = price.pk, price.created_at
        obj._state.adding = False

    def changelist_view(self, request, extra_context=None):
        return rendered_with(
            _IN_FORCE,
            price_history.in_force(),
            lambda: super(PriceAdmin, self).changelist_view(request, extra_context),
        )

    @admin.display(description="GPU class", ordering="gpu_class")
    def class_display(self, obj):
        return obj.gpu_class or "CPU-only node"

    @admin.display(description="in force now", boolean=True)
    def in_force(self, obj):
        in_force = _IN_FORCE.get()
        return obj.pk in (price_history.in_force() if in_force is None else in_force).values()

    @admin.display(description="history of its class")
    def history(self, obj):
        rows = list(Price.objects.filter(gpu_class=obj.gpu_class).order_by("-effective_from"))
        now_id = price_history.in_force().get(obj.gpu_class)
        return format_html(
            "<table><tr><th>from</th><th>per hour</th><th></th></tr>{}</table>",
            format_html_join(
                "",
                "<tr{}><td>{}</td><td>{} {}</td><td>{}</td></tr>",
                (
                    (
                        mark_safe(' class="selected"') if p.pk == obj.pk else "",
                        f"{p.effective_from:%Y-%m-%d %H:%M} UTC",
                        per_hour_text(p.per_hour),
                        p.currency,
                        "in force now"
                        if p.pk == now_id
                        else ("from then on" if p.effective_from > timezone.now() else ""),
                    )
                    for p in rows
                ),
            ),
        )


def per_hour_text(amount) -> str:
    """2.5000 as '2.50', 0.1234 as it is: money to the cent unless the price is finer."""
    return f"{amount:.2f}" if amount == round(amount, 2) else f"{amount.normalize()}"


@admin.register(CostHour)
class CostHourAdmin(ReadOnlyAdmin):
    list_display = (
        "hour",
        "team_display",
        "model_display",
        "gpu_class",
        "gpu_hours",
        "cost",
        "currency",
        "tokens",
        "closed",
    )
    list_filter = ("idle", "closed", "currency")
    search_fields = ("team_name", "model_name", "gpu_class")
    date_hierarchy = "hour"

    def get_queryset(self, request):
        within = cost_scope.seen_by(request.user).within
        rows = super().get_queryset(request)
        return rows if within is None else rows.filter(within)

    @admin.display(description="team", ordering="team_name")
    def team_display(self, obj):
        return "-" if obj.idle else (obj.team_name or "(the fleet's)")

    @admin.display(description="model", ordering="model_name")
    def model_display(self, obj):
        return "idle" if obj.idle else obj.model_name

    @admin.display(description="GPU-hours", ordering="gpu_seconds")
    def gpu_hours(self, obj):
        return f"{obj.gpu_seconds / 3600:.2f}"
