"""The route of teams: ``teams/``.

Its one reason to change: what an operator may do with teams through the API.
"""

from rest_framework import viewsets

from fleet.models import Team

from ..common import ProtectedDeleteMixin
from . import serializers


class TeamViewSet(ProtectedDeleteMixin, viewsets.ModelViewSet):
    """Teams: their members (a group's users), the models and keys they own, their quotas
    and what they hold now."""

    queryset = Team.objects.select_related("group")
    serializer_class = serializers.TeamSerializer
    search_fields = ("name", "description")
    ordering_fields = ("name",)
    filterset_fields = ("name",)
