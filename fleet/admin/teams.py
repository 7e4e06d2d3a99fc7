"""Teams: their members, quotas and what they hold now."""

from contextvars import ContextVar

from django import forms
from django.contrib import admin
from django.contrib.auth.models import Group

from fleet.models import Team
from fleet.services import reach, teams

from .common import rendered_with

# What every team holds, worked out once for a list page's rows.
_USE: ContextVar[dict | None] = ContextVar("team_use", default=None)


class TeamForm(forms.ModelForm):
    class Meta:
        model = Team
        fields = (
            "name",
            "description",
            "group",
            "max_gpus",
            "max_gpu_memory_gb",
            "max_replicas",
            "tokens_per_month",
            "max_priority",
            "guaranteed_gpu_memory_gb",
            "budget_per_month",
            "budget_currency",
            "budget_warn_percent",
        )

    # The user asking (TeamAdmin.get_form): capacity rights need manage_all_teams.
    acting_user = None

    # Fields with a default: left empty, they take it.
    DEFAULTED = ("max_priority", "budget_currency", "budget_warn_percent")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in self.DEFAULTED:
            if name in self.fields:
                self.fields[name].required = False

    def _or_default(self, name: str):
        found = self.cleaned_data.get(name)
        return Team._meta.get_field(name).get_default() if found in (None, "") else found

    def clean_max_priority(self):
        return self._or_default("max_priority")  # left empty: the default, none

    def clean_budget_currency(self):
        return self._or_default("budget_currency")  # the fleet's (LLMGW_COST_CURRENCY)

    def clean_budget_warn_percent(self):
        return self._or_default("budget_warn_percent")

    def clean(self):
        data = super().clean()
        probe = Team(**{f: data.get(f, getattr(self.instance, f)) for f in reach.CAPACITY_FIELDS})
        probe.name = data.get("name") or self.instance.name
        before = self.instance if self.instance.pk else None
        if why := reach.team_capacity_problem(self.acting_user, probe, before):
            self.add_error(None, why)
        name, group = data.get("name"), data.get("group")
        if name and group is None and self.instance.pk is None:
            taken = Team.objects.filter(group__name=name).first()
            if taken is not None:
                self.add_error("group", f"group '{name}' is team '{taken.name}' already")
        return data


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    form = TeamForm
    list_display = (
        "name",
        "group",
        "members",
        "gpus_display",
        "memory_display",
        "replicas_display",
        "tokens_display",
        "spent_display",
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
            "Priority across teams",
            {
                "fields": (("max_priority", "guaranteed_gpu_memory_gb"),),
                "description": "Set only by those with the permission to manage every team. "
                "Its models' priorities stay within its maximum; another team's replica of "
                "higher priority preempts one of its own only while it holds more GPU memory "
                'than it is guaranteed (docs/security.md, "Teams").',
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
        (
            "Budget in money",
            {
                "fields": (
                    ("budget_per_month", "budget_currency", "budget_warn_percent"),
                    "spent",
                ),
                "description": "What its models' GPU-hours may cost per UTC month, at the "
                'prices of Fleet → Prices (docs/operations.md, "What the fleet costs"). '
                "An event at the warning share; once spent, the gateway answers its keys "
                "429. Empty: no bound.",
            },
        ),
    )
    readonly_fields = ("in_use", "spent")

    def get_queryset(self, request):
        # The members column: every team's users in one query, not one per row.
        return super().get_queryset(request).prefetch_related("group__user_set")

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.acting_user = request.user  # a class made for this request
        if obj is None and "group" in form.base_fields:
            field = form.base_fields["group"]
            field.required = False
            field.help_text = "Empty: a group of the team's name, made with it. " + str(
                field.help_text
            )
        return form

    def save_model(self, request, obj, form, change):
        if obj.group_id is None:
            obj.group = Group.objects.get_or_create(name=obj.name)[0]
        super().save_model(request, obj, form, change)

    def changelist_view(self, request, extra_context=None):
        return rendered_with(
            _USE,
            teams.in_use(),
            lambda: super(TeamAdmin, self).changelist_view(request, extra_context),
        )

    def _of(self, obj) -> dict:
        use = _USE.get()
        if use is None:
            use = teams.in_use()
        return use.get(obj.pk, teams.NOTHING_IN_USE)

    @admin.display(description="members")
    def members(self, obj):
        return ", ".join(sorted(u.username for u in obj.group.user_set.all())) or "-"

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

    @admin.display(description="spent this month")
    def spent_display(self, obj):
        return spent_text(obj)

    @admin.display(description="spent this month")
    def spent(self, obj):
        if obj.pk is None:
            return "-"
        text = spent_text(obj)
        if obj.spent_updated_at:
            text += f", as counted at {obj.spent_updated_at:%Y-%m-%d %H:%M} UTC"
        if obj.budget_spent_at:
            text += f"; spent at {obj.budget_spent_at:%Y-%m-%d %H:%M} UTC: its keys are refused"
        elif obj.budget_warned_at:
            text += (
                f"; past {obj.budget_warn_percent}% at {obj.budget_warned_at:%Y-%m-%d %H:%M} UTC"
            )
        return text

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


def spent_text(team) -> str:
    """'412.50 of 1,000.00 EUR', or '412.50 EUR (no budget)'."""
    spent = f"{team.spent_this_month:,.2f}"
    if team.budget_per_month is None:
        return f"{spent} {team.budget_currency} (no budget)"
    return f"{spent} of {team.budget_per_month:,.2f} {team.budget_currency}"
