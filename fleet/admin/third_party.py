"""Admins of the apps we install, held to our rule: every action declares its permission.

django-axes's "Clean up expired attempts" declares none, so anyone who may view
access attempts could delete them; here it needs delete_accessattempt, as the
admin's own "Delete selected" does.
"""

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
