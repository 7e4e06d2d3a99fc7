"""The inference API key of a Batch API request, refused as the gateway refuses one.

The gateway checks keys from its cache in memory; these views are Django's and
ask the database (one indexed query), with the same wording of every refusal
(``fleet.models.access``): a revoked, expired or unknown key, a manage key.
"""

from django.utils import timezone

from fleet.models import ApiKey, ApiKeyScope
from fleet.models.access import bearer_secret


class Refused(Exception):
    """An answer in OpenAI's error shape: status, message, code, param."""

    def __init__(self, status: int, message: str, code: str | None = None, param=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def key_of(request) -> ApiKey:
    headers = (
        [(b"authorization", request.headers["Authorization"].encode("latin-1"))]
        if ("Authorization" in request.headers)
        else []
    )
    try:
        secret = bearer_secret(headers)
    except ValueError:
        raise Refused(
            401, "the Authorization header must be 'Bearer <API key>'", "invalid_api_key"
        ) from None
    if not secret:
        raise Refused(
            401, "no API key: send it as 'Authorization: Bearer <API key>'", "missing_api_key"
        )
    key = ApiKey.find(secret, ApiKey.objects.select_related("team"))
    if key is None:
        shown = secret[:12] + "..." if len(secret) > 12 else "(too short)"
        raise Refused(401, f"invalid API key {shown}", "invalid_api_key")
    if (why := key.usable(timezone.now())) is not None:
        code = "revoked_api_key" if key.revoked_at else "expired_api_key"
        raise Refused(401, why, code)
    if key.scope != ApiKeyScope.INFERENCE:
        raise Refused(
            403,
            f"API key '{key.name}' is a {key.scope} key; the Batch API needs an inference key",
            "wrong_key_scope",
        )
    return key
