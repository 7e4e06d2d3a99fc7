"""Nodes and everything their agents report."""

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, OuterRef, Q, Subquery
from django.utils import timezone

from fleet.models import (
    EngineInstall,
    FabricAttachment,
    LocalWeights,
    Node,
    NodeLoad,
    Shard,
    ShardLoad,
    ShardState,
    Storage,
    VllmBuild,
    WantedEngine,
)
from fleet.services import access, permissions
from fleet.services import drain as drain_service
from fleet.services import engines as engine_service
from fleet.services import nodes as node_service
from fleet.services.units import gpu_use_text

from .common import ReadOnlyAdmin, ReadOnlyTabularInline, count_message, human_bytes
from .gpus import GPUInline, give_notice

# What operators may change on a node; everything else is the agent's word.
OPERATOR_FIELDS = ("cordoned", "draining", "operator_labels", "vllm_build")


class ShardInline(ReadOnlyTabularInline):
    model = Shard
    fk_name = "node"
    fields = (
        "id",
        "replica",
        "rank",
        "state",
        "desired_state",
        "port",
        "restarts",
        "gpu_memory",
        "error",
    )
    readonly_fields = fields
    verbose_name_plural = "shards on this node"

    def get_queryset(self, request):
        return node_service.with_gpu_use(super().get_queryset(request))

    @admin.display(description="replica restarts")
    def restarts(self, obj):
        return obj.replica.restarts

    @admin.display(description="GPU memory (used of budget)")
    def gpu_memory(self, obj):
        return gpu_use_text(obj.gpu_memory_used_mb, obj.gpu_memory_budget_gb)


class FabricInline(ReadOnlyTabularInline):
    model = FabricAttachment
    fields = ("fabric", "hcas", "rate_gbps")
    readonly_fields = fields


class StorageInline(ReadOnlyTabularInline):
    model = Storage
    fields = ("path", "free", "total", "shared")
    readonly_fields = fields

    @admin.display(description="free")
    def free(self, obj):
        return human_bytes(obj.free_bytes)

    @admin.display(description="total")
    def total(self, obj):
        return human_bytes(obj.total_bytes)


class WeightsInline(ReadOnlyTabularInline):
    model = LocalWeights
    fields = ("path", "size", "source", "last_used_at", "unused_since", "pinned", "removal")
    readonly_fields = fields

    @admin.display(description="size")
    def size(self, obj):
        return human_bytes(obj.size_bytes)


class EngineInstallInline(ReadOnlyTabularInline):
    model = EngineInstall
    fields = ("engine", "version", "variant", "state", "progress_percent", "detail")
    readonly_fields = fields


class NodeForm(forms.ModelForm):
    class Meta:
        model = Node
        fields = OPERATOR_FIELDS

    def clean_operator_labels(self):
        labels = self.cleaned_data["operator_labels"]
        if labels in (None, ""):
            return {}
        if not isinstance(labels, dict):
            raise forms.ValidationError('labels must be an object, e.g. {"zone": "a"}')
        bad = [k for k, v in labels.items() if not isinstance(v, str)]
        if bad:
            raise forms.ValidationError(f"label values must be strings: {', '.join(bad)}")
        return labels

    def clean(self):
        cleaned = super().clean()
        # A drain cordons, as drain_node does, so a node drained from this form
        # reads and filters the same as one drained by the action, API or command.
        if cleaned.get("draining"):
            cleaned["cordoned"] = True
        return cleaned


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    form = NodeForm
    list_display = (
        "id",
        "hostname",
        "state",
        "connected",
        "cordoned",
        "draining",
        "last_seen",
        "cpu_percent",
        "memory",
        "gpus_display",
        "shards_display",
        "keeping_up",
        "vllm_build",
        "engine_installs",
        "agent_version",
    )
    list_filter = ("state", "connected", "cordoned", "draining", "vllm_build", "agent_version")
    search_fields = ("id", "hostname", "mgmt_addr")
    actions = (
        "cordon_nodes",
        "drain_nodes",
        "uncordon_nodes",
        give_notice,
        "revoke_credentials",
        "vllm_build_auto",
        "vllm_build_cu13",
        "vllm_build_cu129",
        "vllm_build_cpu",
        "vllm_build_none",
    )
    inlines = (
        GPUInline,
        ShardInline,
        FabricInline,
        StorageInline,
        WeightsInline,
        EngineInstallInline,
    )
    fieldsets = (
        (
            "Operator intent",
            {"fields": OPERATOR_FIELDS},
        ),
        (
            "Reported by the agent",
            {
                "fields": (
                    "id",
                    "hostname",
                    "mgmt_addr",
                    "mgmt_interface",
                    "state",
                    "connected",
                    "last_seen",
                    "registered_at",
                    "agent_version",
                    "engine_versions",
                    "memory",
                    "agent_labels",
                    "effective_labels",
                    "running_shards",
                    "desired_version",
                    "acked_version",
                    "desired_lag_since",
                    "keeping_up",
                    "created_at",
                ),
            },
        ),
        (
            "Notice of going away",
            {"fields": ("notice_deadline", "notice_source", "notice_reason")},
        ),
        (
            "Load",
            {
                "fields": (
                    "load_sampled_at",
                    "cpu_percent",
                    "cpu_count",
                    "load_average",
                    "memory_used",
                    "memory_available",
                )
            },
        ),
    )

    # The actions' permissions, from the one table every door asks (fleet.services.permissions).
    def has_drain_permission(self, request, obj=None):
        return permissions.allowed(request.user, "node.drain")

    def has_notice_permission(self, request, obj=None):
        return permissions.allowed(request.user, "node.notice")

    def has_revoke_permission(self, request, obj=None):
        return permissions.allowed(request.user, "node.revoke")

    def has_vllm_build_permission(self, request, obj=None):
        return permissions.allowed(request.user, "node.vllm_build")

    def get_readonly_fields(self, request, obj=None):
        operator = set(OPERATOR_FIELDS)
        if not self.has_drain_permission(request):
            # Ticking these is a cordon or a drain: the same permission as the actions.
            operator -= {"cordoned", "draining"}
        names = [f.name for f in Node._meta.concrete_fields if f.name not in operator]
        return (
            *names,
            "memory",
            "effective_labels",
            "keeping_up",
            "load_sampled_at",
            "cpu_percent",
            "cpu_count",
            "load_average",
            "memory_used",
            "memory_available",
        )

    def has_add_permission(self, request):
        # Nodes come into being by enrolling with a join token, never by hand.
        return False

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .select_related("load")
            .prefetch_related("gpus", "engine_installs")
            .annotate(
                shard_count=Count("shards", distinct=True),
                ready_count=Count(
                    "shards", filter=Q(shards__state=ShardState.READY), distinct=True
                ),
            )
        )

    def _load(self, obj):
        return node_service.fresh_load(obj, timezone.now())

    @admin.display(description="memory (GB)")
    def memory(self, obj):
        return node_service.memory_gb(obj)

    @admin.display(description="GPUs")
    def gpus_display(self, obj):
        return node_service.gpu_summary(obj.gpus.all())

    @admin.display(description="shards (ready/all)")
    def shards_display(self, obj):
        return f"{getattr(obj, 'ready_count', 0)}/{getattr(obj, 'shard_count', 0)}"

    @admin.display(description="desired set")
    def keeping_up(self, obj):
        return node_service.desired_sync(obj, timezone.now())

    @admin.display(description="engine installs")
    def engine_installs(self, obj):
        return engine_service.installs_summary(obj.engine_installs.all())

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)  # change_node, as node.vllm_build
        if change and "vllm_build" in form.changed_data:
            engine_service.tell_nodes([obj.pk])  # the node acts on it at once

    def _set_build(self, request, queryset, build):
        nodes = list(queryset)
        done = engine_service.set_vllm_build(nodes, build, request.user)
        self.message_user(
            request,
            count_message(done, len(nodes), f"vLLM build {build} on", "had it already")
            + "; each is told at once",
        )

    @admin.action(description="vLLM build: auto (from the driver)", permissions=["vllm_build"])
    def vllm_build_auto(self, request, queryset):
        self._set_build(request, queryset, VllmBuild.AUTO)

    @admin.action(description="vLLM build: CUDA 13", permissions=["vllm_build"])
    def vllm_build_cu13(self, request, queryset):
        self._set_build(request, queryset, VllmBuild.CU13)

    @admin.action(description="vLLM build: CUDA 12.9", permissions=["vllm_build"])
    def vllm_build_cu129(self, request, queryset):
        self._set_build(request, queryset, VllmBuild.CU129)

    @admin.action(description="vLLM build: CPU", permissions=["vllm_build"])
    def vllm_build_cpu(self, request, queryset):
        self._set_build(request, queryset, VllmBuild.CPU)

    @admin.action(description="vLLM build: none (not installed)", permissions=["vllm_build"])
    def vllm_build_none(self, request, queryset):
        self._set_build(request, queryset, VllmBuild.NONE)

    @admin.display(description="labels in effect")
    def effective_labels(self, obj):
        return ", ".join(f"{k}={v}" for k, v in sorted(obj.labels.items())) or "-"

    @admin.display(description="CPU %")
    def cpu_percent(self, obj):
        load = self._load(obj)
        return f"{load.cpu_percent:.0f}" if load else "-"

    @admin.display(description="CPUs")
    def cpu_count(self, obj):
        load = self._load(obj)
        return load.cpu_count if load else "-"

    @admin.display(description="load 1/5/15")
    def load_average(self, obj):
        load = self._load(obj)
        return f"{load.load1:.2f} / {load.load5:.2f} / {load.load15:.2f}" if load else "-"

    @admin.display(description="memory used")
    def memory_used(self, obj):
        load = self._load(obj)
        return human_bytes(load.memory_used_bytes) if load else "-"

    @admin.display(description="memory available")
    def memory_available(self, obj):
        load = self._load(obj)
        return human_bytes(load.memory_available_bytes) if load else "-"

    @admin.display(description="load sampled at")
    def load_sampled_at(self, obj):
        try:
            return obj.load.sampled_at
        except NodeLoad.DoesNotExist:
            return "-"

    @admin.action(description="Cordon: no new placements", permissions=["drain"])
    def cordon_nodes(self, request, queryset):
        nodes = list(queryset)
        done = sum(node_service.cordon(n) for n in nodes)
        self.message_user(request, count_message(done, len(nodes), "cordoned", "already cordoned"))

    @admin.action(
        description="Drain: move replicas elsewhere (replacements ready first)",
        permissions=["drain"],
    )
    def drain_nodes(self, request, queryset):
        nodes = list(queryset)
        done = sum(drain_service.drain_node(n) for n in nodes)
        self.message_user(request, count_message(done, len(nodes), "draining", "already draining"))

    @admin.action(
        description="Uncordon: allow placements again (ends a drain)", permissions=["drain"]
    )
    def uncordon_nodes(self, request, queryset):
        nodes = list(queryset)
        done = sum(node_service.uncordon(n) for n in nodes)
        self.message_user(
            request, count_message(done, len(nodes), "uncordoned", "were not cordoned")
        )

    @admin.action(description="Revoke credentials (disconnects the agent)", permissions=["revoke"])
    def revoke_credentials(self, request, queryset):
        revoked = {n.pk: access.revoke_node(n, request.user) for n in queryset}
        self.message_user(
            request,
            "revoked "
            + ", ".join(f"{count} credential(s) of {node}" for node, count in revoked.items())
            + "; these agents must enrol again with a new join token",
            messages.WARNING,
        )


@admin.register(FabricAttachment)
class FabricAttachmentAdmin(ReadOnlyAdmin):
    list_display = ("node", "fabric", "hcas", "rate_gbps")
    list_filter = ("fabric",)
    search_fields = ("node__id", "fabric")


@admin.register(Storage)
class StorageAdmin(ReadOnlyAdmin):
    list_display = ("node", "path", "free", "total", "shared")
    list_filter = ("shared",)
    search_fields = ("node__id", "path")

    @admin.display(description="free", ordering="free_bytes")
    def free(self, obj):
        return human_bytes(obj.free_bytes)

    @admin.display(description="total", ordering="total_bytes")
    def total(self, obj):
        return human_bytes(obj.total_bytes)


@admin.register(EngineInstall)
class EngineInstallAdmin(ReadOnlyAdmin):
    list_display = ("node", "engine", "version", "variant", "state")
    list_filter = ("engine", "state")
    search_fields = ("node__id", "engine", "version", "detail")


@admin.register(NodeLoad)
class NodeLoadAdmin(ReadOnlyAdmin):
    list_display = (
        "node",
        "sampled_at",
        "cpu_percent",
        "cpu_count",
        "load1",
        "memory_used",
        "memory_available",
    )
    search_fields = ("node__id",)

    @admin.display(description="memory used", ordering="memory_used_bytes")
    def memory_used(self, obj):
        return human_bytes(obj.memory_used_bytes)

    @admin.display(description="memory available", ordering="memory_available_bytes")
    def memory_available(self, obj):
        return human_bytes(obj.memory_available_bytes)


@admin.register(ShardLoad)
class ShardLoadAdmin(ReadOnlyAdmin):
    list_display = ("node", "shard_id", "sampled_at", "cpu_cores", "rss", "gpu_memory")
    search_fields = ("node__id", "shard_id")

    def get_queryset(self, request):
        # The budget is the profile's share, per GPU; the shard may be gone.
        budget = Shard.objects.filter(pk=OuterRef("shard_id")).values(
            "replica__profile__gpu_memory_gb"
        )[:1]
        return super().get_queryset(request).annotate(gpu_budget_gb=Subquery(budget))

    @admin.display(description="RSS", ordering="rss_bytes")
    def rss(self, obj):
        return human_bytes(obj.rss_bytes)

    @admin.display(description="GPU memory (used of budget)", ordering="gpu_memory_mb")
    def gpu_memory(self, obj):
        return gpu_use_text(obj.gpu_memory_mb, obj.gpu_budget_gb)


@admin.register(WantedEngine)
class WantedEngineAdmin(admin.ModelAdmin):
    """The engines every node installs (docs/engines.md); a change reaches nodes at once."""

    list_display = ("engine", "version", "updated_at")
    fields = ("engine", "version")
