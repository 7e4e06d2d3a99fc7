"""The routes of models, engine profiles and the catalog file: ``models/``,
``engine-profiles/`` and ``catalog/``.

Its one reason to change: what an operator may do with the catalog through the API —
models and profiles changed, a canary promoted or aborted, a catalog file applied, and
"where would a replica go, and why" asked.
"""

from django.db import transaction
from django.db.models import Count, Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from fleet.models import EngineProfile, Model, ReplicaState
from fleet.services import canary as canary_service
from fleet.services import catalog, permissions, snapshot

from ..common import Conflict, ProtectedDeleteMixin
from . import filters, serializers

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
