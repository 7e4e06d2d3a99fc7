"""Bearer API keys for the management API. Only ``manage`` keys of staff users count."""

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from fleet.models import ApiKey, ApiKeyScope


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <key>'")
        secret = header[1].decode("latin-1")
        key = ApiKey.find(secret, ApiKey.objects.select_related("user"))
        if key is None:
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
