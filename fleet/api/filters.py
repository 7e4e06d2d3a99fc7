"""Query filters for the management API (``?state=ready&cordoned=false``)."""

import django_filters
from django.core.exceptions import ValidationError

from fleet.models import GPU, EngineProfile, Model, Node, Replica, Shard
from fleet.selectors import effective_labels, parse_selector, selector_matches


def _valid_selector(value: str) -> None:
    try:
        parse_selector(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


class NodeFilterSet(django_filters.FilterSet):
    selector = django_filters.CharFilter(
        method="filter_selector",
        validators=[_valid_selector],
        label="Label selector, e.g. 'zone=a,!spot'; matches the labels in effect.",
    )

    class Meta:
        model = Node
        fields = {
            "state": ["exact", "in"],
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


class GPUFilterSet(django_filters.FilterSet):
    healthy = django_filters.BooleanFilter(method="filter_healthy", label="Has no problems.")

    class Meta:
        model = GPU
        fields = {
            "node": ["exact"],
            "name": ["exact", "icontains"],
            "uuid": ["exact"],
        }

    def filter_healthy(self, queryset, name, value):
        return queryset.filter(problems=[]) if value else queryset.exclude(problems=[])


class ModelFilterSet(django_filters.FilterSet):
    class Meta:
        model = Model
        fields = {"name": ["exact", "icontains"], "placement_policy": ["exact"]}


class EngineProfileFilterSet(django_filters.FilterSet):
    model_name = django_filters.CharFilter(field_name="model__name")

    class Meta:
        model = EngineProfile
        fields = {"model": ["exact"], "engine": ["exact"], "gpu_class": ["exact", "icontains"]}


class ReplicaFilterSet(django_filters.FilterSet):
    model_name = django_filters.CharFilter(field_name="model__name")

    class Meta:
        model = Replica
        fields = {"model": ["exact"], "profile": ["exact"], "state": ["exact", "in"]}


class ShardFilterSet(django_filters.FilterSet):
    model_name = django_filters.CharFilter(field_name="replica__model__name")

    class Meta:
        model = Shard
        fields = {
            "node": ["exact"],
            "replica": ["exact"],
            "state": ["exact", "in"],
            "desired_state": ["exact"],
        }
