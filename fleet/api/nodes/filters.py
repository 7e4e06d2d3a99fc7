"""How a list of nodes or GPUs is narrowed (``?state=ready&cordoned=false``, a label selector).

Its one reason to change: a node's or a GPU's filter added or read differently. The
rules every filter keeps are fleet/api/common.py's.
"""

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db.models import Q
from drf_spectacular.utils import extend_schema_field

from fleet.models import GPU, GPUHealth, Node, NodeState
from fleet.selectors import SELECTOR_PATTERN, effective_labels, parse_selector, selector_matches

from ..common import BooleanFilter, FilterSet, choice_in


def _valid_selector(value: str) -> None:
    try:
        parse_selector(value)
    except ValueError as exc:
        # As params, never in the message: django-filter %-formats the message, and a
        # '%' in what was asked would make a 400 a 500.
        raise ValidationError("%(problem)s", params={"problem": str(exc)}) from None


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
