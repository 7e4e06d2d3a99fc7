"""Bearer API keys for the management API. Only ``manage`` keys of staff users count.

Unknown keys are failed logins to django-axes: after ``LOGIN_FAILURE_LIMIT`` of
them from one address, that address's bearer keys are refused with 429 for
``LOGIN_LOCKOUT_MINUTES``, right or wrong, and it shows in the admin's access
attempts as ``api key <prefix>``.
"""

from axes.handlers.proxy import AxesProxyHandler
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from fleet import audit
from fleet.models import ApiKey, ApiKeyScope
from fleet.models.access import split_prefix

API_PATH = "/api/"


def lockout_parameters(request_or_attempt, credentials=None) -> list:
    """What django-axes locks out (settings.AXES_LOCKOUT_PARAMETERS): user and address alike
    for a login, the address alone for an API key.

    A key is 256 random bits that nobody guesses by trying; locking out by its
    prefix would only let a stranger who saw the prefix in a log lock a working
    key out from everywhere.
    """
    path = getattr(request_or_attempt, "path_info", "") or ""
    return ["ip_address"] if path.startswith(API_PATH) else ["ip_address", "username"]


def _attempt(secret: str) -> dict:
    return {"username": f"api key {split_prefix(secret, ApiKey.KIND) or '?'}"}


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <key>'")
        secret = header[1].decode("latin-1")
        # The Django request: axes keeps its notes on it, and reads its address.
        django_request = request._request
        if AxesProxyHandler.is_locked(django_request, _attempt(secret)):
            raise exceptions.Throttled(
                wait=settings.AXES_COOLOFF_TIME.total_seconds(),
                detail="too many unknown API keys from this address; it is locked out",
            )
        key = ApiKey.find(secret, ApiKey.objects.select_related("user"))
        if key is None:
            user_login_failed.send(
                sender=type(self), credentials=_attempt(secret), request=django_request
            )
            raise exceptions.AuthenticationFailed("unknown API key")
        if (why := key.usable()) is not None:
            raise exceptions.AuthenticationFailed(why)
        if key.scope != ApiKeyScope.MANAGE or key.user is None:
            raise exceptions.AuthenticationFailed(
                f"API key '{key.name}' is an {key.scope} key; the management API needs a manage key"
            )
        if not key.user.is_active:
            raise exceptions.AuthenticationFailed(
                f"API key '{key.name}' belongs to inactive user '{key.user.get_username()}'"
            )
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
        audit.act_as(key.user)  # a manage key acts as its user, in the audit trail too
        return key.user, key

    def authenticate_header(self, request):
        return "Bearer"


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Describes the bearer API key in the OpenAPI schema."""

    target_class = ApiKeyAuthentication
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A manage-scope API key of a staff user: 'Authorization: Bearer lgk_…'.",
        }
