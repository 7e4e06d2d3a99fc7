"""The routes of the workload: ``replicas/``, ``shards/`` and ``events/``.

Its one reason to change: what an operator may read of replicas, shards and events, and
ask of a replica (drain, stop, restart).
"""

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from fleet.models import Event, Replica, Shard
from fleet.services import drain as drain_service
from fleet.services import nodes as node_service
from fleet.services import permissions

from . import filters, serializers


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
        changed, text = drain_service.evict_replica(replica, how, request.user)
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


class ShardViewSet(viewsets.ReadOnlyModelViewSet):
    """A replica's part on one node: one engine process group."""

    queryset = Shard.objects.all()
    serializer_class = serializers.ShardSerializer

    def get_queryset(self):
        return node_service.with_gpu_use(super().get_queryset())

    filterset_class = filters.ShardFilterSet
    search_fields = ("id", "node__id", "error")
    ordering_fields = ("created_at", "state", "node")
