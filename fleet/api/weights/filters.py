"""How a list of weights entries is narrowed (``?node=gpu-01&unused=true``).

Its one reason to change: a filter of weights entries added or read differently.
"""

import django_filters

from fleet.models import LocalWeights

from ..common import BooleanFilter, FilterSet


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
