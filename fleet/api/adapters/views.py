"""The route of LoRA adapters: ``adapters/``.

Its one reason to change: what an operator may do with adapters through the API.
"""

from rest_framework import viewsets

from fleet.models import Adapter

from . import filters, serializers


class AdapterViewSet(viewsets.ModelViewSet):
    """LoRA adapters: asked for by name like models, served by their base model's replicas."""

    queryset = Adapter.objects.select_related("model")
    serializer_class = serializers.AdapterSerializer
    filterset_class = filters.AdapterFilterSet
    search_fields = ("name", "model__name", "source")
    ordering_fields = ("model", "name", "updated_at")
