"""How a list of adapters is narrowed (``?model_name=qwen-7b``).

Its one reason to change: an adapter's filter added or read differently.
"""

import django_filters

from fleet.models import Adapter

from ..common import FilterSet, IdFilter


class AdapterFilterSet(FilterSet):
    model = IdFilter(field_name="model_id", label="The base model's id.")
    model_name = django_filters.CharFilter(field_name="model__name")

    class Meta:
        model = Adapter
        fields = ()
