"""How a team reads and is written through the API: its group, quotas, budget and use.

Its one reason to change: a field of a team, or a rule the API asks of one beyond
Team.clean() (its group, the capacity a user may give it).
"""

from copy import copy

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied

from fleet.models import Team
from fleet.models.catalog import PRIORITY_MAX
from fleet.services import reach, teams

from ..common import INT_MAX, NameRelatedField, ValidatedModelSerializer, actor_of, field_errors


class TeamSerializer(ValidatedModelSerializer):
    group = NameRelatedField(
        slug_field="name",
        queryset=Group.objects.all(),
        required=False,
        help_text="The Django group whose users are its members. Left out of a new team: "
        "a group of the team's name, made if there is none.",
    )
    members = serializers.SerializerMethodField(help_text="Its members' user names.")
    in_use = serializers.SerializerMethodField(
        help_text="What it holds now: GPUs, GPU memory (GB), replicas placed, and tokens "
        "its keys used this UTC month."
    )

    class Meta:
        model = Team
        fields = (
            "id",
            "name",
            "description",
            "group",
            "members",
            "max_gpus",
            "max_gpu_memory_gb",
            "max_replicas",
            "tokens_per_month",
            "max_priority",
            "guaranteed_gpu_memory_gb",
            "budget_per_month",
            "budget_currency",
            "budget_warn_percent",
            "spent_this_month",
            "budget_spent_at",
            "in_use",
            "created_at",
        )
        read_only_fields = ("created_at", "spent_this_month", "budget_spent_at")
        extra_kwargs = {
            "max_gpus": {"max_value": INT_MAX},
            "max_gpu_memory_gb": {"max_value": INT_MAX},
            "guaranteed_gpu_memory_gb": {"max_value": INT_MAX},
            "max_priority": {"min_value": 0, "max_value": PRIORITY_MAX},
            "max_replicas": {"max_value": INT_MAX},
            "tokens_per_month": {"max_value": 2**63 - 1},
            "budget_warn_percent": {"min_value": 1, "max_value": 100},
        }

    def validate(self, attrs):
        if self.instance is None and "group" not in attrs and attrs.get("name"):
            group = Group.objects.filter(name=attrs["name"]).first()
            attrs["group"] = group or Group(name=attrs["name"])
        group = attrs.get("group")
        if group is not None and group.pk is not None:
            other = Team.objects.filter(group=group).exclude(
                pk=self.instance.pk if self.instance else None
            )
            if other.exists():
                raise serializers.ValidationError(
                    {"group": [f"group '{group.name}' is team '{other.first().name}' already"]}
                )
        # The fields' own validators have run (DRF's, from the model's); full_clean()
        # would refuse a group not made yet, which create() makes: clean() is asked alone.
        attrs = serializers.ModelSerializer.validate(self, attrs)
        probe = copy(self.instance) if self.instance is not None else Team()
        for name, value in attrs.items():
            if name != "group":
                setattr(probe, name, value)
        if why := reach.team_capacity_problem(actor_of(self), probe, self.instance):
            raise PermissionDenied(why)
        try:
            probe.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(field_errors(exc)) from None
        return attrs

    def create(self, validated_data):
        group = validated_data["group"]
        if group.pk is None:
            group.save()
        return super().create(validated_data)

    def get_members(self, obj) -> list[str]:
        return sorted(obj.group.user_set.values_list("username", flat=True))

    @extend_schema_field(
        {
            "type": "object",
            "properties": {
                "gpus": {"type": "integer"},
                "gpu_memory_gb": {"type": "number"},
                "replicas": {"type": "integer"},
                "tokens_this_month": {"type": "integer"},
            },
        }
    )
    def get_in_use(self, obj) -> dict:
        use = self.context.get("team_use")
        if use is None:
            use = self.context["team_use"] = teams.in_use()
        return use.get(obj.pk, teams.NOTHING_IN_USE)
