"""Bearer API keys for the management API. Only ``manage`` keys of staff users count."""

from django.utils import timezone
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
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
        return key.user, key

    def authenticate_header(self, request):
        return "Bearer"
