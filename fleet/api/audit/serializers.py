"""How one entry of the audit trail reads through the API.

Its one reason to change: an entry shown differently (a field of django-auditlog's
LogEntry, or of what fleet/audit.py adds to it).
"""

from rest_framework import serializers


class AuditEntrySerializer(serializers.Serializer):
    """One change, as the audit trail keeps it (fleet/audit.py)."""

    id = serializers.IntegerField()
    timestamp = serializers.DateTimeField()
    action = serializers.SerializerMethodField(help_text="create, update or delete.")
    object_type = serializers.CharField(source="content_type.model")
    object = serializers.CharField(source="object_pk", help_text="The object's id.")
    object_repr = serializers.CharField(help_text="The object as it read when changed.")
    actor = serializers.SerializerMethodField(help_text="The user; null: the system itself.")
    door = serializers.SerializerMethodField(
        help_text="admin, console, api, llmgw, manage.py <command> or system."
    )
    remote_addr = serializers.IPAddressField(allow_null=True)
    changes = serializers.SerializerMethodField(
        help_text="{field: [before, after]}; secrets are never recorded."
    )
    detail = serializers.JSONField(
        source="additional_data", help_text="The request, the client, the shell's user …"
    )

    def get_action(self, entry) -> str:
        return {0: "create", 1: "update", 2: "delete"}.get(entry.action, str(entry.action))

    def get_actor(self, entry) -> str | None:
        return entry.actor.get_username() if entry.actor_id else None

    def get_door(self, entry) -> str:
        return (entry.additional_data or {}).get("door", "system")

    def get_changes(self, entry) -> dict:
        return entry.changes_dict
