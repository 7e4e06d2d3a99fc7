"""How a weights entry and a clean-up pass's report read through the API.

Its one reason to change: an entry or a report shown differently
(``weights_gc.inventory.Item``, ``weights_gc.cleanup``'s report).
"""

from rest_framework import serializers


class WeightsSerializer(serializers.Serializer):
    """A weights entry on a node, with what uses it now (``weights_gc.inventory.Item``)."""

    id = serializers.IntegerField(read_only=True)
    node = serializers.CharField(read_only=True)
    path = serializers.CharField(read_only=True)
    source = serializers.CharField(
        read_only=True, help_text="The model_path it was fetched from; empty: found on disk."
    )
    size_bytes = serializers.IntegerField(read_only=True)
    shared = serializers.BooleanField(read_only=True)
    pinned = serializers.BooleanField(read_only=True, help_text="Never removed by the clean-up.")
    last_used_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="When an engine last used it, by the node."
    )
    unused_since = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="Since when nothing on the node needs it, as the clean-up saw; null: in use.",
    )
    in_use_by = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Shards that need it now, as 'model (shard id)'.",
    )
    removal = serializers.ChoiceField(
        choices=["", "proposed", "sent"], read_only=True, help_text="A removal under way."
    )
    kept_reason = serializers.CharField(
        read_only=True, help_text="Why the node kept it the last time it was proposed."
    )

    def to_representation(self, instance):
        return instance.as_dict()


class WeightsProposalSerializer(serializers.Serializer):
    node = serializers.CharField()
    path = serializers.CharField()
    size_bytes = serializers.IntegerField()
    reason = serializers.CharField()


class WeightsCleanupSerializer(serializers.Serializer):
    """What a clean-up pass proposes (or, for GET, would propose) and what it refused."""

    proposals = WeightsProposalSerializer(many=True)
    refused = WeightsProposalSerializer(many=True, help_text="Asked for, and kept: why.")
    waiting = WeightsProposalSerializer(
        many=True,
        help_text="Asked for, and left for a later pass: why not now (a removal already "
        "under way, the node not connected). The request stands.",
    )
    skipped = serializers.BooleanField(
        help_text="A reconciler pass held the lock: nothing was done; try again."
    )

    def to_representation(self, report):
        def one(e, reason):
            return {"node": e.node_id, "path": e.path, "size_bytes": e.size_bytes, "reason": reason}

        return {
            "proposals": [one(p.entry, p.reason) for p in report.proposals],
            "refused": [one(e, why) for e, why in report.refused],
            "waiting": [one(e, why) for e, why in report.waiting],
            "skipped": report.skipped,
        }
