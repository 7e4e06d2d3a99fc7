"""The route of the audit trail: ``audit/``, read-only.

Its one reason to change: what of the trail an operator may read through the API.
"""

from auditlog.models import LogEntry
from rest_framework import viewsets

from . import filters, serializers


class AuditViewSet(viewsets.ReadOnlyModelViewSet):
    """Every change to the catalog, nodes, keys, tokens, weights and users: who made it,
    when, from where, through which door, and each field before and after. Newest first;
    append-only (fleet/audit.py). Reading needs ``auditlog.view_logentry``."""

    queryset = LogEntry.objects.select_related("content_type", "actor").order_by("-timestamp")
    serializer_class = serializers.AuditEntrySerializer
    filterset_class = filters.AuditFilterSet
    ordering_fields = ("timestamp",)
