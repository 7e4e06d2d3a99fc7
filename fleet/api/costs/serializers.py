"""How a price reads and is set through the API, and how a cost report reads.

Its one reason to change: a field of a price or of a report's rows shown or taken
differently.
"""

from __future__ import annotations

from rest_framework import serializers

from fleet.models import Price
from fleet.services import price_history

from ..common import StrictCharField, ValidatedModelSerializer


class PriceSerializer(ValidatedModelSerializer):
    gpu_class = StrictCharField(
        max_length=64,
        allow_blank=True,
        help_text=Price._meta.get_field("gpu_class").help_text,
    )
    currency = StrictCharField(
        max_length=3,
        required=False,
        help_text="Three capital letters; left out: the fleet's (LLMGW_COST_CURRENCY).",
    )
    in_force = serializers.SerializerMethodField(
        help_text="Whether it is its class's price now: the latest of its class that began."
    )

    class Meta:
        model = Price
        fields = ("id", "gpu_class", "per_hour", "currency", "effective_from", "in_force",
                  "created_at")  # fmt: skip
        read_only_fields = ("created_at",)
        # A price of the same class and date replaces that one (costs.set_price).
        validators = []

    def get_in_force(self, obj) -> bool:
        now_ids = self.context.get("in_force")
        if now_ids is None:
            now_ids = self.context["in_force"] = set(price_history.in_force().values())
        return obj.pk in now_ids


class CostRowSerializer(serializers.Serializer):
    team = serializers.CharField(
        allow_null=True, help_text='null: not reported by team; "": the fleet\'s (no team).'
    )
    model = serializers.CharField(allow_null=True, help_text="null: not reported by model.")
    gpu_class = serializers.CharField(
        allow_null=True,
        help_text='The GPU\'s name (idle rows always have it); "": CPU-only nodes; null: '
        "not reported by GPU.",
    )
    idle = serializers.BooleanField(help_text="What no replica held: nobody's, shown apart.")
    gpu_hours = serializers.FloatField(help_text="A share of a GPU counts its share.")
    cost = serializers.DecimalField(max_digits=24, decimal_places=6)
    currency = serializers.CharField()
    tokens = serializers.IntegerField(help_text="Prompt + completion tokens served.")
    cost_per_million_tokens = serializers.DecimalField(
        max_digits=30, decimal_places=6, allow_null=True, help_text="null: no tokens."
    )
    utilisation = serializers.FloatField(
        allow_null=True,
        help_text="Tokens served against what the GPU-hours could have served at the "
        "model's measured peak, 0 to 1; null: idle, or no peak measured yet.",
    )


class CostReportSerializer(serializers.Serializer):
    start = serializers.DateTimeField(help_text="The period's first hour (UTC).")
    end = serializers.DateTimeField(help_text="The end of its last hour, left out.")
    by = serializers.ListField(child=serializers.CharField())
    seen = serializers.CharField(help_text="Whose costs the caller sees (docs/api.md).")
    rows = CostRowSerializer(many=True, help_text="Teams' and models', most cost first.")
    idle = CostRowSerializer(many=True, help_text="What no replica held, by GPU.")
    totals = CostRowSerializer(many=True, help_text="Per currency: the rows and idle shown.")
    unpriced = serializers.ListField(
        child=serializers.CharField(), help_text="GPUs with hours and no price: costed at 0."
    )
