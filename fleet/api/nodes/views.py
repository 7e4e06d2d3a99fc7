"""The routes of nodes, GPUs and wanted engines: ``nodes/``, ``gpus/`` and ``engines/``.

Its one reason to change: what an operator may read of a node or a GPU and ask of it
(cordon, drain, uncordon, revoke, notice, logs, vLLM build, a GPU's fault cleared),
and which engines every node installs.
"""

from dataclasses import asdict

from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from fleet.models import GPU, Node, WantedEngine
from fleet.services import access, gpu_health, node_logs, permissions
from fleet.services import drain as drain_service
from fleet.services import engines as engine_service
from fleet.services import nodes as node_service

from ..common import Conflict, NodeTimeout
from . import filters, serializers

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
        except ValueError as exc:
            raise ValidationError({"reason": [str(exc)]}) from None
        gpu = self.get_queryset().get(pk=gpu.pk)
        return Response({"changed": changed, "detail": text, "gpu": self.get_serializer(gpu).data})
