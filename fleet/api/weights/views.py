"""The route of weights on nodes: ``weights/``, with pin, unpin, remove and the clean-up.

Its one reason to change: what an operator may read of weights on nodes and ask of them.
"""

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from fleet.models import LocalWeights
from fleet.services import permissions
from fleet.services.weights_gc import cleanup as weights_cleanup
from fleet.services.weights_gc import inventory as weights_inventory

from . import filters, serializers


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
