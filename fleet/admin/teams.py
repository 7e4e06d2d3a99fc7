"""Teams: their members, quotas and what they hold now."""

from contextvars import ContextVar

from django.contrib import admin

from fleet.models import Team
from fleet.services import teams

# What every team holds, worked out once for a list page's rows.
_USE: ContextVar[dict | None] = ContextVar("team_use", default=None)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "group",
        "members",
        "gpus_display",
        "memory_display",
        "replicas_display",
        "tokens_display",
    )
    search_fields = ("name", "description", "group__name")
    list_select_related = ("group",)
    fieldsets = (
        (
            None,
            {
                "fields": ("name", "description", "group"),
                "description": "Its members are the users of its group. They change the "
                "team's models and API keys (as far as their permissions go) and see the "
                "rest read-only.",
            },
        ),
        (
            "Quotas",
            {
                "fields": (
                    ("max_gpus", "max_gpu_memory_gb", "max_replicas"),
                    "tokens_per_month",
                    "in_use",
                ),
                "description": "Empty: no bound. Placement leaves a replica pending, with "
                "the reason, rather than take the team past a quota; the gateway answers "
                "429 once its keys have used the month's tokens.",
            },
        ),
    )
    readonly_fields = ("in_use",)

    def changelist_view(self, request, extra_context=None):
        token = _USE.set(teams.in_use())
        try:
            response = super().changelist_view(request, extra_context)
            if hasattr(response, "render"):
                response.render()  # while the figures are set
            return response
        finally:
            _USE.reset(token)

    def _of(self, obj) -> dict:
        use = _USE.get()
        if use is None:
            use = teams.in_use()
        return use.get(obj.pk, teams.NOTHING_IN_USE)

    @admin.display(description="members")
    def members(self, obj):
        return ", ".join(sorted(obj.group.user_set.values_list("username", flat=True))) or "-"

    @admin.display(description="GPUs")
    def gpus_display(self, obj):
        return _of_quota(self._of(obj)["gpus"], obj.max_gpus)

    @admin.display(description="GPU memory (GB)")
    def memory_display(self, obj):
        return _of_quota(self._of(obj)["gpu_memory_gb"], obj.max_gpu_memory_gb)

    @admin.display(description="replicas")
    def replicas_display(self, obj):
        return _of_quota(self._of(obj)["replicas"], obj.max_replicas)

    @admin.display(description="tokens this month")
    def tokens_display(self, obj):
        return _of_quota(self._of(obj)["tokens_this_month"], obj.tokens_per_month)

    @admin.display(description="in use now")
    def in_use(self, obj):
        if obj.pk is None:
            return "-"
        u = self._of(obj)
        return (
            f"{u['gpus']} GPUs, {u['gpu_memory_gb']:g} GB of GPU memory, {u['replicas']} "
            f"replicas; {u['tokens_this_month']:,} tokens this month"
        )


def _of_quota(used, quota) -> str:
    shown = f"{used:,}" if isinstance(used, int) else f"{used:g}"
    return f"{shown} of {quota:,}" if quota is not None else f"{shown} (no quota)"
