"""The catalog: models and how they run. This is what operators edit."""

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q

from fleet.models import Adapter, EngineProfile, Event, Model, ReplicaState
from fleet.services import adapters, canary, estimate, permissions, profiles, reach
from fleet.services.autoscaler.status import scaling_status, sleep_status

from .common import TeamScoped

ARGS_ENV = ("args", "env")
ARGS_ENV_RECORD = ("args_env_changed_by", "args_env_changed_at")


def args_env_read_only(request) -> tuple:
    """args and env, when this user may not set them: the form then neither shows
    them as inputs nor takes them from a post (fleet.services.profiles)."""
    return ARGS_ENV if profiles.args_env_refusal(request.user) is not None else ()


def stamp_if_args_env_changed(request, form) -> None:
    if any(name in form.changed_data for name in ARGS_ENV):
        for name, value in profiles.args_env_stamp(request.user).items():
            setattr(form.instance, name, value)


class EngineProfileInline(TeamScoped, admin.StackedInline):
    model = EngineProfile
    extra = 0
    show_change_link = True
    fields = (
        ("name", "engine"),
        ("tp", "pp", "gpus_per_node", "gpu_memory_gb", "nodes"),
        ("gpu_class", "min_memory_gb", "node_selector"),
        ("context_tokens", "sequences", "memory_estimate"),
        ("model_path", "weights_sha256"),
        "served_model_name",
        ("args", "env"),
        ARGS_ENV_RECORD,
        ("startup_timeout_s", "max_adapters"),
    )

    def get_readonly_fields(self, request, obj=None):
        return (*ARGS_ENV_RECORD, *args_env_read_only(request), "memory_estimate")

    @admin.display(description="memory estimate")
    def memory_estimate(self, obj):
        return estimate.profile_text(obj) if obj.pk else "-"


class AdapterInline(TeamScoped, admin.TabularInline):
    model = Adapter
    extra = 0
    fields = ("name", "source", "sha256", "rank", "where")
    readonly_fields = ("where",)

    @admin.display(description="loaded on")
    def where(self, obj):
        return adapters.where_text(obj) if obj.pk else "-"


@admin.register(Adapter)
class AdapterAdmin(TeamScoped, admin.ModelAdmin):
    list_display = ("name", "model", "source", "rank", "where", "last_request_at")
    list_filter = ("model__team", "model")
    search_fields = ("name", "model__name", "source")
    list_select_related = ("model",)
    readonly_fields = ("where", "last_request_at", "created_at", "updated_at")

    @admin.display(description="loaded on")
    def where(self, obj):
        return adapters.where_text(obj) if obj.pk else "-"


class ModelReachForm(forms.ModelForm):
    # The user asking (ModelAdmin.get_form): what the model may reach is theirs to set.
    acting_user = None

    def clean(self):
        data = super().clean()
        was = self.instance  # as stored: the form's values go on it after clean()
        probe = Model(
            name=data.get("name", was.name),
            team=data["team"] if "team" in data else was.team,
            fallbacks=data["fallbacks"] if "fallbacks" in data else was.fallbacks,
        )
        before = (was.team_id, was.fallbacks) if was.pk else None
        if why := reach.model_fallbacks_problem(self.acting_user, probe, before):
            self.add_error("fallbacks" if "fallbacks" in self.fields else None, why)
        return data


@admin.register(Model)
class ModelAdmin(TeamScoped, admin.ModelAdmin):
    form = ModelReachForm
    list_display = (
        "name",
        "team",
        "desired_replicas",
        "replicas_display",
        "scaling_display",
        "sleep_display",
        "active_profile",
        "placement_policy",
        "priority",
        "prefix_routing",
        "updated_at",
    )
    list_filter = ("team", "placement_policy", "prefix_routing")
    search_fields = ("name", "description")
    inlines = (EngineProfileInline, AdapterInline)
    readonly_fields = (
        "canary_started_at",
        "scaling_display",
        "sleep_display",
        "waiting_requests",
        "last_request_at",
        "last_scaled_at",
        "created_at",
        "updated_at",
    )
    fieldsets = (
        (
            None,
            {"fields": ("name", "team", "description", "active_profile", "placement_policy")},
        ),
        ("Replicas", {"fields": ("desired_replicas", "priority", "replace_after_s")}),
        (
            "Routing and weights",
            {"fields": ("private", "prefix_routing", "fallbacks", "weights_retention_s")},
        ),
        (
            "Canary",
            {
                "description": "A second profile beside the active one, with a share of the "
                "requests; promote or abort it with the actions (docs/operations.md).",
                "fields": (
                    ("canary_profile", "canary_percent"),
                    ("canary_max_error_rate", "canary_max_ttft_ratio"),
                    ("canary_window_s", "canary_min_requests", "canary_auto_promote"),
                    "canary_started_at",
                ),
            },
        ),
        (
            "Autoscaling and scale to zero",
            {
                "description": "Set min and max replicas to let the autoscaler move desired "
                "replicas between them (docs/operations.md).",
                "fields": (
                    ("min_replicas", "max_replicas"),
                    "scale_to_zero_after_s",
                    "target_outstanding",
                    ("max_waiting", "max_wait_s"),
                    "scaling_display",
                    ("waiting_requests", "last_request_at", "last_scaled_at"),
                ),
            },
        ),
        (
            "Sleep",
            {
                "description": "Idle replicas give their GPU memory back and keep their "
                "engines; a request wakes them in seconds (docs/operations.md, "
                '"Sleep and wake").',
                "fields": (
                    ("sleep_after_s", "sleep_level"),
                    "stop_after_asleep_s",
                    "sleep_display",
                ),
            },
        ),
        (None, {"fields": ("created_at", "updated_at")}),
    )

    actions = ("promote_canary", "abort_canary")

    def has_canary_permission(self, request, obj=None):
        return permissions.allowed(request.user, "model.canary")

    def _canary(self, request, queryset, change) -> None:
        for model in queryset:
            try:
                self.message_user(request, change(model, request.user))
            except canary.NoCanary as exc:
                self.message_user(request, str(exc), messages.WARNING)

    @admin.action(description="Promote the canary to the active profile", permissions=["canary"])
    def promote_canary(self, request, queryset):
        self._canary(request, queryset, canary.promote)

    @admin.action(description="Abort the canary (its replicas drain)", permissions=["canary"])
    def abort_canary(self, request, queryset):
        self._canary(request, queryset, canary.abort)

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            # A profile's name shows its model's: without the model, a query per row.
            .select_related("active_profile__model", "team")
            .annotate(
                replica_count=Count("replicas", distinct=True),
                ready_count=Count(
                    "replicas", filter=Q(replicas__state=ReplicaState.READY), distinct=True
                ),
                asleep_count=Count(
                    "replicas", filter=Q(replicas__state=ReplicaState.ASLEEP), distinct=True
                ),
            )
        )

    @admin.display(description="replicas (ready/all)")
    def replicas_display(self, obj):
        return f"{obj.ready_count}/{obj.replica_count}"

    @admin.display(description="scaling")
    def scaling_display(self, obj):
        ready = getattr(obj, "ready_count", None)
        if ready is None and obj.pk:
            ready = obj.replicas.filter(state=ReplicaState.READY).count()
        return scaling_status(obj, ready) or "-"

    @admin.display(description="sleep")
    def sleep_display(self, obj):
        asleep = getattr(obj, "asleep_count", None)
        if asleep is None and obj.pk:
            asleep = obj.replicas.filter(state=ReplicaState.ASLEEP).count()
        return sleep_status(obj, asleep) or "-"

    def save_formset(self, request, form, formset, change):
        if formset.model is EngineProfile:
            for profile_form in formset.forms:
                stamp_if_args_env_changed(request, profile_form)
        super().save_formset(request, form, formset, change)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.acting_user = request.user  # a class made for this request
        # Only this model's own profiles can be its active one.
        field = form.base_fields.get("active_profile")
        if field is not None:
            field.queryset = (
                EngineProfile.objects.filter(model=obj)
                if obj is not None
                else EngineProfile.objects.none()
            )
        return form


@admin.register(EngineProfile)
class EngineProfileAdmin(TeamScoped, admin.ModelAdmin):
    list_display = (
        "__str__",
        "engine",
        "gpu_class",
        "tp",
        "pp",
        "gpus_per_node",
        "gpu_memory_gb",
        "nodes",
        "min_memory_gb",
        "memory_estimate",
        "node_selector",
        "updated_at",
    )
    list_filter = ("engine", "model__team", "model")
    search_fields = ("name", "model__name", "model_path", "served_model_name")
    list_select_related = ("model",)

    def get_readonly_fields(self, request, obj=None):
        # A profile belongs to its model for life (replicas point at it).
        fixed = () if obj is None else ("model",)
        return (
            *fixed,
            *args_env_read_only(request),
            *ARGS_ENV_RECORD,
            "memory_estimate",
            "created_at",
            "updated_at",
        )

    @admin.display(description="memory estimate")
    def memory_estimate(self, obj):
        return estimate.profile_text(obj) if obj.pk else "-"

    def save_model(self, request, obj, form, change):
        stamp_if_args_env_changed(request, form)
        super().save_model(request, obj, form, change)


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """The control plane's own decisions, with their reasons: read-only."""

    list_display = (
        "created_at",
        "kind",
        "model_name",
        "node_id",
        "direction",
        "from_replicas",
        "to_replicas",
        "reason",
    )
    list_filter = ("kind", "direction", "model_name")
    search_fields = ("model_name", "node_id", "reason")
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
