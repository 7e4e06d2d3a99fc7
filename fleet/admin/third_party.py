"""Admins of the apps we install, held to our rule: every action declares its permission.

django-axes's "Clean up expired attempts" declares none, so anyone who may view
access attempts could delete them; here it needs delete_accessattempt, as the
admin's own "Delete selected" does.
"""

from auditlog import admin as auditlog_admin  # the same: registered first, replaced here
from auditlog.models import LogEntry
from axes import admin as axes_admin  # registers axes's admins first, to be replaced here
from axes.models import AccessAttempt
from django.contrib import admin


class AccessAttemptAdmin(axes_admin.AccessAttemptAdmin):
    @admin.action(description="Clean up expired attempts", permissions=["delete"])
    def cleanup_expired_attempts(self, request, queryset):
        # axes reads the time of the login attempt in hand, which an admin page has not
        # got (its action answered 500): none means now.
        if not hasattr(request, "axes_attempt_time"):
            request.axes_attempt_time = None
        return super().cleanup_expired_attempts(request, queryset)


if admin.site.is_registered(AccessAttempt):
    admin.site.unregister(AccessAttempt)
    admin.site.register(AccessAttempt, AccessAttemptAdmin)


class DoorFilter(admin.SimpleListFilter):
    title = "door"
    parameter_name = "door"

    def lookups(self, request, model_admin):
        doors = ("admin", "console", "api", "llmgw", "manage.py", "agent", "system")
        return [(d, d) for d in doors]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(additional_data__door__startswith=self.value())
        return queryset


# django-auditlog's entries (fleet/audit.py): append-only here too, so nobody deletes
# one from the admin, and each shows the door it came through and the address.
class LogEntryAdmin(auditlog_admin.LogEntryAdmin):
    list_display = [*auditlog_admin.LogEntryAdmin.list_display, "door", "remote_addr"]
    list_filter = [*auditlog_admin.LogEntryAdmin.list_filter, DoorFilter]

    fieldsets = [
        (None, {"fields": ["created", "user_url", "door", "remote_addr", "resource_url", "cid"]}),
        *auditlog_admin.LogEntryAdmin.fieldsets[1:],
    ]
    readonly_fields = [*auditlog_admin.LogEntryAdmin.readonly_fields, "door", "remote_addr"]

    def has_delete_permission(self, request, obj=None):
        return False  # removed only by LLMGW_AUDIT_RETENTION_DAYS

    @admin.display(description="door")
    def door(self, obj):
        return (obj.additional_data or {}).get("door", "system")


if admin.site.is_registered(LogEntry):
    admin.site.unregister(LogEntry)
admin.site.register(LogEntry, LogEntryAdmin)
