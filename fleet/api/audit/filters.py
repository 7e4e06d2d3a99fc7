"""How the audit trail is narrowed (``?actor=ops&since=2026-12-01T00:00:00Z``).

Its one reason to change: a filter of the audit trail added or read differently.
"""

from datetime import UTC

import django_filters
from auditlog.models import LogEntry
from django import forms
from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field

from ..common import BooleanFilter, FilterSet


class UtcIsoDateTimeField(django_filters.fields.IsoDateTimeField):
    """An ISO 8601 time, in UTC: PostgreSQL takes no offset past ±15:59, ISO allows more."""

    def to_python(self, value):
        value = super().to_python(value)
        if value is None:
            return None
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError(f"{value.isoformat()} is past the last date") from None


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


@extend_schema_field({"type": "string", "enum": ["create", "update", "delete"]})
class ActionFilter(django_filters.ChoiceFilter):
    """A change's kind by its name; the column holds a number (LogEntry.Action)."""


class AuditFilterSet(FilterSet):
    """The audit trail's entries, newest first, narrowed as an operator asks."""

    actor = django_filters.CharFilter(
        field_name=f"actor__{get_user_model().USERNAME_FIELD}", label="A username."
    )
    system = BooleanFilter(
        field_name="actor", lookup_expr="isnull", label="true: the system's own changes only."
    )
    door = django_filters.CharFilter(
        field_name="additional_data__door",
        label="admin, console, api, llmgw, manage.py <command> or system.",
    )
    object_type = django_filters.CharFilter(
        field_name="content_type__model", label="model, engineprofile, node, apikey …"
    )
    object = django_filters.CharFilter(field_name="object_pk", label="The object's id.")
    action = ActionFilter(
        choices=[("create", "create"), ("update", "update"), ("delete", "delete")],
        method="filter_action",
    )
    since = UtcDateTimeFilter(field_name="timestamp", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="timestamp", lookup_expr="lt")

    class Meta:
        model = LogEntry
        fields = []

    def filter_action(self, queryset, name, value):
        actions = LogEntry.Action
        code = {"create": actions.CREATE, "update": actions.UPDATE, "delete": actions.DELETE}
        return queryset.filter(action=code[value])
