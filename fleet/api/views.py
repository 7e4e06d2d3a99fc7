"""The management API: thin viewsets over the fleet models and services."""

from dataclasses import asdict
from datetime import UTC

from auditlog.models import LogEntry
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Count, Prefetch, ProtectedError, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, ValidationError
from rest_framework.response import Response

from fleet.models import (
    GPU,
    Adapter,
    ApiKey,
    EngineProfile,
    Event,
    KeyUsage,
    LocalWeights,
    Model,
    Node,
    Replica,
    ReplicaState,
    Shard,
    Team,
    WantedEngine,
)
from fleet.services import (
    access,
    api_keys,
    catalog,
    gpu_health,
    node_logs,
    permissions,
    snapshot,
)
from fleet.services import canary as canary_service
from fleet.services import drain as drain_service
from fleet.services import engines as engine_service
from fleet.services import nodes as node_service
from fleet.services.weights_gc import cleanup as weights_cleanup
from fleet.services.weights_gc import inventory as weights_inventory

from . import filters, serializers


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class NodeTimeout(APIException):
    status_code = status.HTTP_504_GATEWAY_TIMEOUT
    default_code = "node_timeout"


LOG_LINES_MAX = 2000


NODE_EXAMPLE = OpenApiExample(
    "A GPU node",
    value={
        "id": "gpu-01",
        "hostname": "gpu-01.example",
        "mgmt_addr": "10.0.0.7",
        "mgmt_interface": "eth0",
        "state": "ready",
        "cordoned": False,
        "draining": False,
        "connected": True,
        "last_seen": "2026-12-01T03:49:13.291554Z",
        "registered_at": "2026-11-20T09:12:44.100000Z",
        "agent_version": "0.1.0",
        "engine_versions": {"vllm": "0.11.0", "llamacpp": "0.3.16"},
        "memory_total_mb": 2063500,
        "agent_labels": {"zone": "a"},
        "operator_labels": {"tier": "gold"},
        "labels": {"zone": "a", "tier": "gold"},
        "desired_version": 12,
        "acked_version": 12,
        "desired_lag_since": None,
        "not_keeping_up": False,
        "gpus": [
            {
                "id": 1,
                "node": "gpu-01",
                "index": 0,
                "uuid": "GPU-5f1c8a2e-0000-4b7d-9e2a-3c6f0d1b0000",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total_mb": 81559,
                "memory_used_mb": 412,
                "compute_capability": "9.0",
                "numa_node": 0,
                "pci_bus_id": "00000000:18:00.0",
                "driver_version": "550.90.07",
                "cuda_version": "12.4",
                "nvlink_peers": [1, 2, 3, 4, 5, 6, 7],
                "ecc_errors": 0,
                "temperature_c": 34,
                "problems": [],
                "healthy": True,
            }
        ],
        "fabrics": [{"fabric": "ib0", "hcas": ["mlx5_0", "mlx5_1"], "rate_gbps": 400}],
        "engine_installs": [],
        "load": {
            "sampled_at": "2026-12-01T03:49:10.000000Z",
            "cpu_percent": 37.5,
            "cpu_count": 224,
            "load1": 3.5,
            "load5": 3.0,
            "load15": 2.5,
            "memory_used_bytes": 442381631488,
            "memory_available_bytes": 1717986918400,
        },
    },
    response_only=True,
)
NODE_RESPONSE = {"responses": serializers.NodeSerializer, "examples": [NODE_EXAMPLE]}


@extend_schema_view(retrieve=extend_schema(**NODE_RESPONSE))
class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes as their agents report them, with operator intent (cordoned, draining)."""

    queryset = Node.objects.select_related("load").prefetch_related(
        "gpus", "fabrics", "engine_installs"
    )
    serializer_class = serializers.NodeSerializer
    filterset_class = filters.NodeFilterSet
    search_fields = ("id", "hostname", "mgmt_addr")
    ordering_fields = ("id", "state", "last_seen")
    # Moving workload is its own permission, not change_node (FleetModelPermissions).
    # The node each answers with needs view_node (fleet.services.permissions).
    action_permissions = {
        n: ["fleet.view_node", *permissions.needs(f"node.{n}")]
        for n in ("cordon", "drain", "uncordon", "revoke", "vllm_build", "notice")
    }

    def _intent(self, request, change):
        node = self.get_object()
        change(node)
        node = self.get_queryset().get(pk=node.pk)
        return Response(self.get_serializer(node).data)

    @extend_schema(request=None, **NODE_RESPONSE)
    @action(detail=True, methods=["post"])
    def cordon(self, request, pk=None):
        """No new placements on this node. Idempotent."""
        return self._intent(request, node_service.cordon)

    @extend_schema(request=None, **NODE_RESPONSE)
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        """Cordon, start replacements elsewhere, and once they are ready retire what runs here."""
        return self._intent(request, drain_service.drain_node)

    @extend_schema(request=None, **NODE_RESPONSE)
    @action(detail=True, methods=["post"])
    def uncordon(self, request, pk=None):
        """Allow placements again; also ends a drain. Idempotent."""
        return self._intent(request, node_service.uncordon)

    @extend_schema(request=None, responses=serializers.RevokedSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the node's credentials and close its socket; its agent must enrol again."""
        node = self.get_object()
        return Response({"node": node.pk, "revoked": access.revoke_node(node, request.user)})

    @extend_schema(responses=serializers.NodeRowSerializer(many=True))
    @action(detail=False, methods=["get"], pagination_class=None, filterset_class=None)
    def table(self, request):
        """The node table as ``manage.py nodes`` prints it, one row per node; "-" is unknown."""
        return Response([asdict(row) for row in node_service.node_rows()])

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "source",
                {"type": "string", "maxLength": 100},
                description="'agent' (default) or a shard's id.",
            ),
            OpenApiParameter(
                "lines",
                {"type": "integer", "minimum": 1, "maximum": LOG_LINES_MAX},
                description=f"How many of the last lines, 1 to {LOG_LINES_MAX} (default 200).",
            ),
        ],
        responses={
            200: serializers.NodeLogsSerializer,
            400: OpenApiResponse(description="`lines` or `source` out of bounds."),
            409: OpenApiResponse(description="The node's agent has no socket open."),
            504: OpenApiResponse(description="The node did not answer in time."),
        },
    )
    @action(detail=True, methods=["get"], filterset_class=None)
    def logs(self, request, pk=None):
        """The last lines of the agent's log or a shard's, asked of the node now (≤ 10 s).

        409 when the node has no socket open, 504 when it does not answer in time.
        """
        node = self.get_object()
        source = request.query_params.get("source", "agent") or "agent"
        try:
            lines = int(request.query_params.get("lines", 200))
        except ValueError:
            raise ValidationError({"lines": ["must be an integer"]}) from None
        if not 1 <= lines <= LOG_LINES_MAX:
            raise ValidationError({"lines": [f"must be between 1 and {LOG_LINES_MAX}"]})
        if len(source) > 100:
            raise ValidationError({"source": ["must be at most 100 characters"]})
        if not node.connected or not node.channel_name:
            raise Conflict(f"no agent connected: node {node.pk} has no open socket")
        try:
            reply = node_logs.request_logs(node.pk, source, lines)
        except node_logs.NodeUnreachable as exc:
            raise NodeTimeout(
                f"{exc}; the agent may be older than the control plane "
                "(it does not know the logs request)"
            ) from None
        return Response(
            {
                "node": node.pk,
                "source": source,
                "lines": reply.lines,
                "sources": reply.sources,
                "error": reply.error,
            }
        )

    @extend_schema(request=serializers.VllmBuildSerializer, responses=serializers.NodeSerializer)
    @action(detail=True, methods=["post"], url_path="vllm-build")
    def vllm_build(self, request, pk=None):
        """Which vLLM build this node installs: auto, cu13, cu129 or none. The node is told
        at once; idempotent."""
        node = self.get_object()
        body = serializers.VllmBuildSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        engine_service.set_vllm_build([node], body.validated_data["vllm_build"], request.user)
        node = self.get_queryset().get(pk=node.pk)
        return Response(self.get_serializer(node).data)

    @extend_schema(
        request=serializers.NodeNoticeSerializer,
        responses=serializers.NoticeGivenSerializer,
    )
    @action(detail=True, methods=["post"])
    def notice(self, request, pk=None):
        """The node goes away in ``in_s`` seconds: it drains now, replacements first, and
        what is left ``LLMGW_NOTICE_DRAIN_S`` before then drains anyway. An earlier notice
        stands against a later one (docs/operations.md, "GPU faults and notices")."""
        node = self.get_object()
        body = serializers.NodeNoticeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        given = body.validated_data
        try:
            text = gpu_health.give_notice(
                node, given["in_s"], "operator", given.get("reason", ""), request.user
            )
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        except ValueError as exc:
            raise ValidationError({"in_s": [str(exc)]}) from None
        node = self.get_queryset().get(pk=node.pk)
        return Response({"detail": text, "node": self.get_serializer(node).data})


class WantedEngineViewSet(viewsets.ModelViewSet):
    """Engines every node installs, at a version (docs/engines.md). Nodes hear of a change
    at once; each installs the build its hardware and vLLM build call for."""

    queryset = WantedEngine.objects.all()
    serializer_class = serializers.WantedEngineSerializer
    ordering_fields = ("engine",)


class GPUViewSet(viewsets.ReadOnlyModelViewSet):
    """Every GPU in the fleet, as NVML reports it, with its health (docs/operations.md,
    "GPU faults and notices")."""

    queryset = GPU.objects.all()
    serializer_class = serializers.GPUSerializer
    filterset_class = filters.GPUFilterSet
    search_fields = ("uuid", "name", "node__id", "pci_bus_id")
    ordering_fields = ("node", "index", "memory_used_mb")
    action_permissions = {"clear": ["fleet.view_gpu", *permissions.needs("gpu.clear")]}

    @extend_schema(
        request=serializers.GPUClearSerializer, responses=serializers.GPUClearedSerializer
    )
    @action(detail=True, methods=["post"])
    def clear(self, request, pk=None):
        """Clear the GPU's fault (it was reset or swapped, or the fault was the driver's):
        it may be placed on again. What the agent reads on it now (problems, slowdowns)
        stays. Idempotent: a GPU without a fault answers ``changed: false``."""
        gpu = self.get_object()
        body = serializers.GPUClearSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            changed, text = gpu_health.clear(gpu, request.user, body.validated_data["reason"])
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        except ValueError as exc:
            raise ValidationError({"reason": [str(exc)]}) from None
        gpu = self.get_queryset().get(pk=gpu.pk)
        return Response({"changed": changed, "detail": text, "gpu": self.get_serializer(gpu).data})


class ProtectedDeleteMixin:
    def perform_destroy(self, instance):
        try:
            instance.delete()
        except ProtectedError as exc:
            users = sorted({str(o) for o in exc.protected_objects})
            raise Conflict(
                f"{instance._meta.verbose_name} '{instance}' is in use by "
                f"{len(users)} object(s): {', '.join(users[:5])}"
            ) from None


MODEL_EXAMPLE = OpenApiExample(
    "A model",
    value={
        "name": "qwen2.5-7b-instruct",
        "description": "Chat, 7B",
        "desired_replicas": 2,
        "placement_policy": "spread",
    },
    request_only=True,
)
PROFILE_EXAMPLE = OpenApiExample(
    "Two GPUs with vLLM",
    value={
        "model": 1,
        "name": "h100-tp2",
        "engine": "vllm",
        "gpu_class": "H100",
        "tp": 2,
        "gpus_per_node": 2,
        "model_path": "/models/qwen2.5-7b-instruct",
        "args": ["--max-model-len", "8192"],
        "env": {"VLLM_USE_V1": "1"},
        "min_memory_gb": 64,
        "node_selector": "zone=a,!spot",
    },
    request_only=True,
)
EXPLAIN_EXAMPLE = OpenApiExample(
    "One node fits",
    value={
        "model": "qwen2.5-7b-instruct",
        "profile": "h100-tp2",
        "summary": "vllm, 2 H100 GPU(s), 64 GB of memory, policy spread",
        "choice": "would go to gpu-01 (port 20001, 2 GPUs)",
        "placement": [
            {"node": "gpu-01", "rank": 0, "gpus": ["GPU-5f1c8a2e", "GPU-9b0d4c17"], "port": 20001}
        ],
        "nodes": [
            {"node": "gpu-01", "fits": True, "reason": "gpu-01: fits"},
            {"node": "gpu-02", "fits": False, "reason": "gpu-02: cordoned"},
        ],
    },
    response_only=True,
)


CANARY_SCHEMA = {
    "request": serializers.CanaryWhySerializer,
    "responses": {
        200: serializers.CanaryDoneSerializer,
        409: OpenApiResponse(description="The model runs no canary."),
    },
}


@extend_schema_view(
    create=extend_schema(examples=[MODEL_EXAMPLE]),
    update=extend_schema(examples=[MODEL_EXAMPLE]),
)
class ModelViewSet(ProtectedDeleteMixin, viewsets.ModelViewSet):
    """Models operators want served, and how many replicas of each."""

    queryset = Model.objects.annotate(
        ready_count=Count("replicas", filter=Q(replicas__state=ReplicaState.READY)),
        asleep_count=Count("replicas", filter=Q(replicas__state=ReplicaState.ASLEEP)),
    )
    serializer_class = serializers.ModelSerializer
    filterset_class = filters.ModelFilterSet
    search_fields = ("name", "description")
    ordering_fields = ("name", "updated_at")

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "profile",
                str,
                description="Ask about this profile of the model instead of its active one.",
            )
        ],
        responses={
            200: serializers.ExplanationSerializer,
            404: OpenApiResponse(description="No model with this id, or no such profile of it."),
            409: OpenApiResponse(description="No profile named, and the model has no active one."),
        },
        examples=[EXPLAIN_EXAMPLE],
    )
    @action(detail=True, methods=["get"])
    def explain(self, request, pk=None):
        """Every node and why a new replica could run there or not; ?profile= asks "what if"."""
        model = self.get_object()
        profile = request.query_params.get("profile")
        if profile is None and model.active_profile_id is None:
            # The request is fine; the model is not ready to be asked about.
            raise Conflict(f"model '{model.name}' has no active profile; name one with ?profile=")
        try:
            result = snapshot.explain_model(model.name, profile)
        except snapshot.ExplainError as exc:
            # The model exists (get_object), so what is missing is the profile asked about.
            raise NotFound(str(exc)) from None
        return Response(result.as_dict())

    action_permissions = {
        a: ["fleet.view_model", *permissions.needs("model.canary")]
        for a in ("promote", "abort_canary")
    }

    def _canary(self, request, change):
        model = self.get_object()
        body = serializers.CanaryWhySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            text = change(model, request.user, body.validated_data.get("why", ""))
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        except canary_service.NoCanary as exc:
            raise Conflict(str(exc)) from None
        model = self.get_queryset().get(pk=model.pk)
        return Response({"detail": text, "model": self.get_serializer(model).data})

    @extend_schema(**CANARY_SCHEMA)
    @action(detail=True, methods=["post"])
    def promote(self, request, pk=None):
        """The canary becomes the active profile; the other replicas are replaced in turn."""
        return self._canary(request, canary_service.promote)

    @extend_schema(**CANARY_SCHEMA)
    @action(detail=True, methods=["post"], url_path="abort-canary")
    def abort_canary(self, request, pk=None):
        """The canary is dropped; its replicas drain and stop."""
        return self._canary(request, canary_service.abort)


@extend_schema_view(
    create=extend_schema(examples=[PROFILE_EXAMPLE]),
    update=extend_schema(examples=[PROFILE_EXAMPLE]),
)
class EngineProfileViewSet(ProtectedDeleteMixin, viewsets.ModelViewSet):
    """How a model runs: engine, parallelism, GPUs, arguments and requirements."""

    queryset = EngineProfile.objects.select_related("model")
    serializer_class = serializers.EngineProfileSerializer
    filterset_class = filters.EngineProfileFilterSet
    search_fields = ("name", "model__name", "model_path")
    ordering_fields = ("model", "name", "updated_at")


class AdapterViewSet(viewsets.ModelViewSet):
    """LoRA adapters: asked for by name like models, served by their base model's replicas."""

    queryset = Adapter.objects.select_related("model")
    serializer_class = serializers.AdapterSerializer
    filterset_class = filters.AdapterFilterSet
    search_fields = ("name", "model__name", "source")
    ordering_fields = ("model", "name", "updated_at")


class ReplicaViewSet(viewsets.ReadOnlyModelViewSet):
    """Serving copies of models and their shards. The reconciler owns them."""

    queryset = Replica.objects.select_related("model")
    serializer_class = serializers.ReplicaSerializer

    def get_queryset(self):
        shards = node_service.with_gpu_use(Shard.objects.all())
        return super().get_queryset().prefetch_related(Prefetch("shards", queryset=shards))

    filterset_class = filters.ReplicaFilterSet
    ordering_fields = ("created_at", "state")
    action_permissions = {
        a: ["fleet.view_replica", *permissions.needs(f"replica.{a}")]
        for a in drain_service.EVICT_WORDS
    }

    def _evict(self, request, how: str):
        replica = self.get_object()
        try:
            changed, text = drain_service.evict_replica(replica, how, request.user)
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        replica = self.get_queryset().get(pk=replica.pk)
        body = {"changed": changed, "detail": text, "replica": replica}
        return Response(serializers.EvictedSerializer(body).data)

    @extend_schema(request=None, responses=serializers.EvictedSerializer)
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        """A replacement is placed first; once it is ready this replica drains and stops."""
        return self._evict(request, "drain")

    @extend_schema(request=None, responses=serializers.EvictedSerializer)
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        """Drains now and stops; the model's desired_replicas goes down by one."""
        return self._evict(request, "stop")

    @extend_schema(request=None, responses=serializers.EvictedSerializer)
    @action(detail=True, methods=["post"])
    def restart(self, request, pk=None):
        """Drains now and stops; a new replica is placed at once in its stead."""
        return self._evict(request, "restart")


class EventViewSet(viewsets.ReadOnlyModelViewSet):
    """What the control plane decided by itself, with its reason: the autoscaler's steps."""

    queryset = Event.objects.all()
    serializer_class = serializers.EventSerializer
    filterset_class = filters.EventFilterSet
    ordering_fields = ("created_at",)


class TeamViewSet(ProtectedDeleteMixin, viewsets.ModelViewSet):
    """Teams: their members (a group's users), the models and keys they own, their quotas
    and what they hold now."""

    queryset = Team.objects.select_related("group")
    serializer_class = serializers.TeamSerializer
    search_fields = ("name", "description")
    ordering_fields = ("name",)
    filterset_fields = ("name",)


class AuditViewSet(viewsets.ReadOnlyModelViewSet):
    """Every change to the catalog, nodes, keys, tokens, weights and users: who made it,
    when, from where, through which door, and each field before and after. Newest first;
    append-only (fleet/audit.py). Reading needs ``auditlog.view_logentry``."""

    queryset = LogEntry.objects.select_related("content_type", "actor").order_by("-timestamp")
    serializer_class = serializers.AuditEntrySerializer
    filterset_class = filters.AuditFilterSet
    ordering_fields = ("timestamp",)


class ShardViewSet(viewsets.ReadOnlyModelViewSet):
    """A replica's part on one node: one engine process group."""

    queryset = Shard.objects.all()
    serializer_class = serializers.ShardSerializer

    def get_queryset(self):
        return node_service.with_gpu_use(super().get_queryset())

    filterset_class = filters.ShardFilterSet
    search_fields = ("id", "node__id", "error")
    ordering_fields = ("created_at", "state", "node")


class CatalogViewSet(viewsets.ViewSet):
    """The catalog file (models and their engine profiles) applied or asked about, as
    ``manage.py apply`` and ``manage.py explain -f`` do it."""

    queryset = Model.objects.none()  # for the permissions of what is not an action here
    # Applying asks, per change in the file, what the per-object API asks for it
    # (catalog.apply, with the caller as the actor): no blanket permission here.
    action_permissions = {
        "apply": [],
        "explain": ["fleet.view_model", "fleet.view_node"],
    }

    @extend_schema(
        request=serializers.CatalogApplySerializer, responses=serializers.ApplyResultSerializer
    )
    @action(detail=False, methods=["post"])
    def apply(self, request):
        """Apply a catalog file: all of it, or nothing (400 lists every problem)."""
        body = serializers.CatalogApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            result = catalog.apply(
                body.validated_data["catalog"],
                dry_run=body.validated_data["dry_run"],
                actor=request.user,
            )
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        except catalog.CatalogError as exc:
            raise ValidationError({"catalog": exc.errors}) from None
        return Response(
            {
                "dry_run": body.validated_data["dry_run"],
                "changes": result.changes,
                "unchanged": result.unchanged,
            }
        )

    @extend_schema(
        request=serializers.CatalogExplainSerializer,
        responses={
            200: OpenApiTypes.OBJECT,
            404: OpenApiResponse(description="No such model, or no such profile of it."),
            409: OpenApiResponse(description="No profile named, and the model has no active one."),
        },
    )
    @action(detail=False, methods=["post"])
    def explain(self, request):
        """Why a new replica of a model could run on each node, with a catalog file
        considered applied first (nothing is saved): what if."""
        body = serializers.CatalogExplainSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            with transaction.atomic():
                if data.get("catalog"):
                    catalog.apply(data["catalog"])
                result = snapshot.explain_model(data["model"], data.get("profile") or None)
                transaction.set_rollback(True)  # explain never changes anything
        except catalog.CatalogError as exc:
            raise ValidationError({"catalog": exc.errors}) from None
        except snapshot.NoActiveProfile as exc:
            # As GET models/{id}/explain/: a model with nothing to explain is in the
            # wrong state for it, and a model or profile named and missing is not found.
            raise Conflict(str(exc)) from None
        except snapshot.ExplainError as exc:
            raise NotFound(str(exc)) from None
        return Response({**result.as_dict(), "lines": result.lines()})


class JoinTokenViewSet(viewsets.ViewSet):
    """Join tokens that let new nodes enrol, as ``manage.py create_join_token`` makes them."""

    queryset = Model.objects.none()
    action_permissions = {"create": list(permissions.needs("join_token.create"))}

    @extend_schema(
        request=serializers.JoinTokenRequestSerializer,
        responses={201: serializers.SecretSerializer},
    )
    def create(self, request):
        """A new join token; its secret is in this answer only."""
        body = serializers.JoinTokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            ttl = api_keys.parse_duration(data["ttl"])
            token, secret = access.create_join_token(
                data["name"], ttl=ttl, max_uses=data["uses"], actor=request.user
            )
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        except ValueError as exc:
            raise ValidationError({"detail": [str(exc)]}) from None
        return Response(
            {"name": token.name, "prefix": token.prefix, "secret": secret,
             "expires_at": token.expires_at, "uses": token.max_uses},
            status=status.HTTP_201_CREATED,
        )  # fmt: skip


class ApiKeyViewSet(viewsets.ViewSet):
    """API keys, as ``manage.py create_api_key`` makes them. A key made here is the asking
    user's own unless ``user`` names another, which needs ``manage_others_api_keys``; so
    does rotating or revoking a key that is not one's own."""

    queryset = ApiKey.objects.none()
    lookup_field = "prefix"
    # The gate; whose key it is, the service checks (api_keys.check_actor).
    action_permissions = {
        "create": list(permissions.needs("api_key.create")),
        "partial_update": list(permissions.needs("api_key.set_limits")),
        "rotate": list(permissions.needs("api_key.rotate")),
        "revoke": list(permissions.needs("api_key.revoke")),
    }

    @extend_schema(
        request=serializers.ApiKeyRequestSerializer,
        responses={201: serializers.SecretSerializer},
    )
    def create(self, request):
        """A new API key; its secret is in this answer only."""
        body = serializers.ApiKeyRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        owner = request.user
        if data.get("user") and data["user"] != request.user.get_username():
            # Before looking the name up: whether a user exists is not for the refused.
            try:
                permissions.require(
                    request.user,
                    [permissions.OTHERS_API_KEYS],
                    f"mint an API key of user '{data['user']}'",
                )
            except permissions.Refused as exc:
                raise PermissionDenied(str(exc)) from None
            owner = _user(data["user"])
        try:
            expires_at = api_keys.parse_expiry(data["expires"]) if data.get("expires") else None
            key, secret = api_keys.create_api_key(
                data["name"],
                scope=data["scope"],
                user=owner,
                allowed_models=data.get("models") or [],
                expires_at=expires_at,
                limits={f: data[f] for f in api_keys.LIMIT_FIELDS if f in data},
                fallbacks=data.get("fallbacks") or [],
                team=_team(data["team"]) if data.get("team") else None,
                actor=request.user,
            )
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        except ValueError as exc:
            raise ValidationError({"detail": [str(exc)]}) from None
        return Response(
            {"name": key.name, "prefix": key.prefix, "secret": secret,
             "expires_at": key.expires_at, "scope": key.scope,
             "user": key.user.get_username() if key.user else None},
            status=status.HTTP_201_CREATED,
        )  # fmt: skip

    @extend_schema(request=serializers.ApiKeyChangeSerializer, responses={200: OpenApiTypes.OBJECT})
    def partial_update(self, request, prefix=None):
        """Change a key's limits — a number (0: none) or null (the gateway's default) — and
        its fallbacks, in order ([]: none)."""
        key = _api_key(prefix)
        body = serializers.ApiKeyChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        fallbacks = data.pop("fallbacks", None)
        try:
            with transaction.atomic():
                if data:
                    api_keys.set_limits(key, data, actor=request.user)
                if fallbacks is not None:
                    api_keys.set_fallbacks(key, fallbacks, actor=request.user)
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        except api_keys.ApiKeyError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        return Response(
            {"name": key.name, "prefix": key.prefix, **_limits(key), "fallbacks": key.fallbacks}
        )

    @extend_schema(
        request=serializers.ApiKeyRotateSerializer,
        responses={
            201: OpenApiTypes.OBJECT,
            409: OpenApiResponse(description="The key is revoked: it cannot get a new secret."),
        },
    )
    @action(detail=True, methods=["post"])
    def rotate(self, request, prefix=None):
        """A new secret, in this answer only; the old one keeps working for ``grace``."""
        key = _api_key(prefix)
        body = serializers.ApiKeyRotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            secret = api_keys.rotate_api_key(
                key, api_keys.parse_duration(body.validated_data["grace"]), actor=request.user
            )
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        except OverflowError:
            raise ValidationError({"grace": ["a grace period that long is not a date"]}) from None
        except api_keys.ApiKeyError as exc:
            if exc.field == "key":  # revoked: the request is fine, the key's state is not
                raise Conflict(str(exc)) from None
            raise ValidationError({exc.field or "detail": [str(exc)]}) from None
        except ValueError as exc:
            raise ValidationError({"detail": [str(exc)]}) from None
        return Response(
            {"name": key.name, "prefix": key.prefix, "secret": secret,
             "expires_at": key.expires_at, "old_secret_until": key.previous_secret_expires_at},
            status=status.HTTP_201_CREATED,
        )  # fmt: skip

    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["post"])
    def revoke(self, request, prefix=None):
        """Refuse this key from now on; it cannot be undone. Idempotent."""
        key = _api_key(prefix)
        try:
            live = api_keys.revoke_api_key(key, actor=request.user)
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        return Response({"name": key.name, "prefix": key.prefix, "revoked": live})


def _user(username: str):
    User = get_user_model()
    user = User.objects.filter(**{User.USERNAME_FIELD: username}).first()
    if user is None:
        raise ValidationError({"user": [f"no user '{username}'"]})
    return user


def _team(name: str) -> Team:
    team = Team.objects.filter(name=name).first()
    if team is None:
        known = ", ".join(Team.objects.values_list("name", flat=True)) or "none"
        raise ValidationError({"team": [f"no team named '{name}' (teams: {known})"]})
    return team


def _api_key(prefix: str) -> ApiKey:
    key = ApiKey.objects.filter(prefix=prefix).first()
    if key is None:
        raise NotFound(f"no API key with prefix '{prefix}'")
    return key


def _limits(key: ApiKey) -> dict:
    return {f: getattr(key, f) for f in api_keys.LIMIT_FIELDS}


class UsageViewSet(viewsets.ViewSet):
    """Tokens per key, model and hour (UTC), as the gateways count them from the engines'
    ``usage``; written in batches, so the last few seconds may not be here yet."""

    queryset = KeyUsage.objects.none()

    @extend_schema(
        parameters=[
            OpenApiParameter("key", str, description="A key's prefix or name."),
            OpenApiParameter("model", str),
            OpenApiParameter(
                "since", str, description="24h, 7d… or an ISO 8601 time (default 7d)."
            ),
        ],
        responses={200: serializers.KeyUsageSerializer(many=True)},
    )
    def list(self, request):
        since_text = request.query_params.get("since") or "7d"
        try:
            since = timezone.now() - api_keys.parse_duration(since_text)
        except (ValueError, OverflowError):
            try:
                when = parse_datetime(since_text.strip().replace("Z", "+00:00"))
            except ValueError:
                when = None
            if when is None:
                raise ValidationError(
                    {"since": [f"'{since_text}' is neither a duration (7d) nor an ISO 8601 time"]}
                ) from None
            since = when if timezone.is_aware(when) else when.replace(tzinfo=UTC)
        rows = api_keys.usage(
            key=request.query_params.get("key"),
            model=request.query_params.get("model"),
            since=since,
        )
        return Response(serializers.KeyUsageSerializer(rows[:10_000], many=True).data)


@extend_schema_view(
    list=extend_schema(responses=serializers.WeightsSerializer(many=True)),
    retrieve=extend_schema(responses=serializers.WeightsSerializer),
)
class WeightsViewSet(viewsets.ReadOnlyModelViewSet):
    """Weights on nodes, with what uses them; pin, unpin, remove now, and the clean-up."""

    queryset = LocalWeights.objects.order_by("node_id", "path")
    serializer_class = serializers.WeightsSerializer
    filterset_class = filters.WeightsFilterSet
    search_fields = ("path", "source", "node__id")
    ordering_fields = ("node", "path", "size_bytes", "last_used_at", "unused_since")
    action_permissions = {
        **{
            n: ["fleet.view_localweights", *permissions.needs(f"weights.{n}")]
            for n in ("pin", "unpin", "remove")
        },
        "cleanup": ["fleet.view_localweights"],
        "cleanup_run": ["fleet.view_localweights", *permissions.needs("weights.cleanup")],
    }

    def list(self, request, *args, **kwargs):
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        rows = page if page is not None else queryset
        data = [i.as_dict() for i in weights_inventory.annotate(rows)]
        return self.get_paginated_response(data) if page is not None else Response(data)

    def retrieve(self, request, *args, **kwargs):
        [item] = weights_inventory.annotate([self.get_object()])
        return Response(item.as_dict())

    def _pin(self, pinned: bool):
        row = self.get_object()
        weights_inventory.set_pinned([row.pk], pinned)
        row.refresh_from_db()
        [item] = weights_inventory.annotate([row])
        return Response(item.as_dict())

    @extend_schema(request=None, responses=serializers.WeightsSerializer)
    @action(detail=True, methods=["post"])
    def pin(self, request, pk=None):
        """Never remove this entry (on a shared filesystem: on any node)."""
        return self._pin(True)

    @extend_schema(request=None, responses=serializers.WeightsSerializer)
    @action(detail=True, methods=["post"])
    def unpin(self, request, pk=None):
        return self._pin(False)

    @extend_schema(request=None, responses=serializers.WeightsCleanupSerializer)
    @action(detail=True, methods=["post"])
    def remove(self, request, pk=None):
        """Remove it now if nothing needs it and it is not pinned; the node checks again.

        The answer says whether it was proposed, or why not."""
        row = self.get_object()
        report = weights_inventory.request_removal([row.pk])
        return Response(serializers.WeightsCleanupSerializer(report).data)

    @extend_schema(responses=serializers.WeightsCleanupSerializer, filters=False)
    @action(detail=False, methods=["get"], pagination_class=None, filterset_class=None)
    def cleanup(self, request):
        """What a clean-up pass would propose now, and why (a dry run: changes nothing)."""
        return Response(serializers.WeightsCleanupSerializer(weights_cleanup.dry_run()).data)

    @extend_schema(request=None, responses=serializers.WeightsCleanupSerializer)
    @cleanup.mapping.post
    def cleanup_run(self, request):
        """Run a clean-up pass now (beat runs one every LLMGW_WEIGHTS_GC_INTERVAL_S)."""
        report = weights_cleanup.run_locked(wait_s=5.0)
        return Response(serializers.WeightsCleanupSerializer(report).data)
