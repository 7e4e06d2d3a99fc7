"""How a LoRA adapter reads and is written through the API, with where it is loaded.

Its one reason to change: a field of an adapter, or a rule the API asks of one beyond
Adapter.clean() (whose base model it may name).
"""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied

from fleet.models import Adapter
from fleet.services import adapters, teams

from ..common import SMALLINT_MAX, ValidatedModelSerializer, actor_of, sha256_map


class AdapterPlaceSerializer(serializers.Serializer):
    replica = serializers.CharField()
    node = serializers.CharField()
    state = serializers.CharField(help_text="loading, loaded or failed")
    error = serializers.CharField(help_text="The engine's reason, where it failed.")


class AdapterSerializer(ValidatedModelSerializer):
    model_name = serializers.CharField(source="model.name", read_only=True)
    sha256 = sha256_map("sha256")
    loaded = serializers.SerializerMethodField(help_text="Where its base model's replicas hold it.")

    class Meta:
        model = Adapter
        fields = (
            "id",
            "name",
            "model",
            "model_name",
            "description",
            "source",
            "sha256",
            "rank",
            "loaded",
            "last_request_at",
            "created_at",
            "updated_at",
        )
        extra_kwargs = {"rank": {"max_value": SMALLINT_MAX}}
        read_only_fields = ("last_request_at", "created_at", "updated_at")

    @extend_schema_field(AdapterPlaceSerializer(many=True))
    def get_loaded(self, obj) -> list:
        return [
            {"replica": r, "node": n, "state": s, "error": e} for r, n, s, e in adapters.where(obj)
        ]

    def validate_model(self, value):
        if why := teams.problem(
            actor_of(self), value.team_id, f"add an adapter to model '{value}'"
        ):
            raise PermissionDenied(why)
        return value
