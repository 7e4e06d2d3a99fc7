"""How a list of models or engine profiles is narrowed (``?name=``, ``?engine=vllm``).

Its one reason to change: a model's or a profile's filter added or read differently.
"""

import django_filters

from fleet.models import EngineProfile, Model

from ..common import FilterSet, IdFilter


class ModelFilterSet(FilterSet):
    class Meta:
        model = Model
        fields = {"name": ["exact", "icontains"], "placement_policy": ["exact"]}


class EngineProfileFilterSet(FilterSet):
    model = IdFilter(field_name="model_id", label="The model's id.")
    model_name = django_filters.CharFilter(field_name="model__name")

    class Meta:
        model = EngineProfile
        fields = {"engine": ["exact"], "gpu_class": ["exact", "icontains"]}
