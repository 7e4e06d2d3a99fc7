"""How a list of replicas, shards or events is narrowed (``?state__in=ready,starting``).

Its one reason to change: a replica's, a shard's or an event's filter added or read
differently.
"""

import django_filters

from fleet.models import Event, Replica, ReplicaState, Shard, ShardState

from ..common import FilterSet, IdFilter, choice_in


class EventFilterSet(FilterSet):
    model = IdFilter(field_name="model_id", label="The model's id.")
    node = django_filters.CharFilter(field_name="node_id", label="The node it concerns.")

    class Meta:
        model = Event
        fields = {"kind": ["exact"], "model_name": ["exact"], "direction": ["exact"]}


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
