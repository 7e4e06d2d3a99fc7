"""Query filters for the management API (``?state=ready&cordoned=false``).

What the schema says of a filter is what it does: a value of the wrong type is
a 400 naming the parameter, never quietly ignored, and an id that matches
nothing is an empty page, not an error. An empty value (``?state=``) is no
filter, as the schema says (``allowEmptyValue``, fleet/api/schema.py).
"""

from datetime import UTC

import django_filters
from auditlog.models import LogEntry
from django import forms
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from drf_spectacular.utils import extend_schema_field

from fleet.models import (
    GPU,
    Adapter,
    EngineProfile,
    Event,
    GPUHealth,
    LocalWeights,
    Model,
    Node,
    NodeState,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
)
from fleet.selectors import SELECTOR_PATTERN, effective_labels, parse_selector, selector_matches


def _valid_selector(value: str) -> None:
    try:
        parse_selector(value)
    except ValueError as exc:
        # As params, never in the message: django-filter %-formats the message, and a
        # '%' in what was asked would make a 400 a 500.
        raise ValidationError("%(problem)s", params={"problem": str(exc)}) from None


class StrictBooleanField(forms.Field):
    """``true`` or ``false`` (or 1, 0), any case; anything else is an error, not "no filter"."""

    widget = forms.TextInput
    VALUES = {"true": True, "1": True, "false": False, "0": False}

    def to_python(self, value):
        if value in self.empty_values:
            return None
        try:
            return self.VALUES[str(value).lower()]
        except KeyError:
            raise ValidationError(
                "must be true or false, not %(value)r", params={"value": value}
            ) from None

    def validate(self, value):
        pass  # None (no filter), True or False: each is valid


class BooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


# Ids are positive 64-bit integers; past that the database cannot even compare.
ID_MAX = 2**63 - 1


class IdField(forms.IntegerField):
    def __init__(self, **kwargs):
        super().__init__(min_value=1, max_value=ID_MAX, **kwargs)


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": ID_MAX})
class IdFilter(django_filters.Filter):
    """A related object's id, looked up as given: an id that names nothing matches nothing.

    django-filter's default for a foreign key (ModelChoiceFilter) answers 400 for
    an id that does not exist, which a client cannot know from the schema.
    """

    field_class = IdField


class ChoiceInFilter(django_filters.BaseInFilter, django_filters.ChoiceFilter):
    """``?state__in=ready,suspect``: each value one of the choices, or a 400 naming it.

    django-filter's own ``__in`` filter for a choice field takes any text and
    matches nothing with it, while the schema lists the choices.
    """


def choice_in(field_name: str, choices) -> ChoiceInFilter:
    return ChoiceInFilter(
        field_name=field_name, lookup_expr="in", choices=choices, label="Any of, comma-separated."
    )


class FilterSet(django_filters.FilterSet):
    FILTER_DEFAULTS = {
        **django_filters.FilterSet.FILTER_DEFAULTS,
        models.BooleanField: {"filter_class": BooleanFilter},
    }


class NodeFilterSet(FilterSet):
    selector = extend_schema_field({"type": "string", "pattern": SELECTOR_PATTERN})(
        django_filters.CharFilter(
            method="filter_selector",
            validators=[_valid_selector],
            label="Label selector, e.g. 'zone=a,!spot'; matches the labels in effect.",
        )
    )
    state__in = choice_in("state", NodeState.choices)

    class Meta:
        model = Node
        fields = {
            "state": ["exact"],
            "cordoned": ["exact"],
            "draining": ["exact"],
            "connected": ["exact"],
            "agent_version": ["exact"],
            "hostname": ["exact", "icontains"],
        }

    def filter_selector(self, queryset, name, value):
        reqs = parse_selector(value)
        # Labels are JSON merged from two fields; a fleet is small enough to match here.
        rows = queryset.values_list("id", "agent_labels", "operator_labels")
        ids = [
            pk for pk, agent, oper in rows if selector_matches(reqs, effective_labels(agent, oper))
        ]
        return queryset.filter(pk__in=ids)


@extend_schema_field({"type": "integer", "minimum": 0, "maximum": 32767})
class IndexFilter(django_filters.Filter):
    """A GPU's index on its node: a whole number, or a 400 (not 0.5 read as 0)."""

    field_class = forms.IntegerField


class GPUFilterSet(FilterSet):
    node = django_filters.CharFilter(field_name="node_id", label="The node's id.")
    index = IndexFilter(min_value=0, max_value=32767, label="Its index on the node.")
    healthy = BooleanFilter(method="filter_healthy", label="Has no problems and is healthy.")
    health__in = choice_in("health", GPUHealth.choices)

    class Meta:
        model = GPU
        fields = {
            "name": ["exact", "icontains"],
            "uuid": ["exact"],
            "health": ["exact"],
        }

    def filter_healthy(self, queryset, name, value):
        # What placement takes (fleet.services.snapshot): no problem and health healthy.
        usable = Q(problems=[], health=GPUHealth.HEALTHY)
        return queryset.filter(usable) if value else queryset.exclude(usable)


class ModelFilterSet(FilterSet):
    class Meta:
        model = Model
        fields = {"name": ["exact", "icontains"], "placement_policy": ["exact"]}


class EventFilterSet(FilterSet):
    model = IdFilter(field_name="model_id", label="The model's id.")
    node = django_filters.CharFilter(field_name="node_id", label="The node it concerns.")

    class Meta:
        model = Event
        fields = {"kind": ["exact"], "model_name": ["exact"], "direction": ["exact"]}


class EngineProfileFilterSet(FilterSet):
    model = IdFilter(field_name="model_id", label="The model's id.")
    model_name = django_filters.CharFilter(field_name="model__name")

    class Meta:
        model = EngineProfile
        fields = {"engine": ["exact"], "gpu_class": ["exact", "icontains"]}


class AdapterFilterSet(FilterSet):
    model = IdFilter(field_name="model_id", label="The base model's id.")
    model_name = django_filters.CharFilter(field_name="model__name")

    class Meta:
        model = Adapter
        fields = ()


class ReplicaFilterSet(FilterSet):
    model = IdFilter(field_name="model_id", label="The model's id.")
    profile = IdFilter(field_name="profile_id", label="The engine profile's id.")
    model_name = django_filters.CharFilter(field_name="model__name")
    state__in = choice_in("state", ReplicaState.choices)

    class Meta:
        model = Replica
        fields = {"state": ["exact"], "id": ["startswith"]}


class ShardFilterSet(FilterSet):
    node = django_filters.CharFilter(field_name="node_id", label="The node's id.")
    replica = django_filters.CharFilter(field_name="replica_id", label="The replica's id.")
    model_name = django_filters.CharFilter(field_name="replica__model__name")
    state__in = choice_in("state", ShardState.choices)

    class Meta:
        model = Shard
        fields = {
            "state": ["exact"],
            "desired_state": ["exact"],
        }


class WeightsFilterSet(FilterSet):
    node = django_filters.CharFilter(field_name="node_id", label="The node's id.")
    unused = BooleanFilter(
        method="filter_unused",
        label="true: only entries no desired or running shard needs (computed now).",
    )

    class Meta:
        model = LocalWeights
        fields = {"pinned": ["exact"], "shared": ["exact"], "source": ["exact"]}

    def filter_unused(self, queryset, name, value):
        if value is None:
            return queryset
        from fleet.services.weights_gc.inventory import annotate

        ids = [i.row.pk for i in annotate(queryset) if i.unused == value]
        return queryset.filter(pk__in=ids)


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
