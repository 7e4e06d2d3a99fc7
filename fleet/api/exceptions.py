"""How the management API answers errors: DRF's shapes, with a duplicate a conflict.

Every error is JSON. Most are ``{"detail": "..."}`` (401, 403, 404, 409, 429, and
400 for a body that is not JSON); a request whose fields are wrong is 400 with
the wrong fields as keys, each with a list of messages (``non_field_errors`` for
rules across fields). fleet/api/schema.py declares both shapes in the schema.
"""

from django.http import JsonResponse
from django.views import defaults
from rest_framework import status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.views import exception_handler

from fleet.services.permissions import Refused


def _codes(codes) -> set[str]:
    """Every error code in a ValidationError's ``get_codes()``, however nested."""
    if isinstance(codes, dict):
        codes = list(codes.values())
    if isinstance(codes, list):
        return set().union(*map(_codes, codes))
    return {codes}


def handle(exc, context):
    """DRF's handler; a service's refusal is 403; a request wrong only in naming something
    that exists already is 409.

    A service refuses an actor with ``permissions.Refused``, whose message names who,
    what and the permission missing: every door of the API answers it here, 403 with
    that message, so no view translates it on its own.

    Creating a model whose name is taken is not a malformed request but one that
    conflicts with what is there, which is what 409 says (RFC 9110, 15.5.10): a
    client can tell "fix your input" from "it exists already" by the status.
    """
    if isinstance(exc, Refused):
        exc = PermissionDenied(str(exc))
    response = exception_handler(exc, context)
    if (
        response is not None
        and isinstance(exc, ValidationError)
        and _codes(exc.get_codes()) == {"unique"}
    ):
        response.status_code = status.HTTP_409_CONFLICT
    return response


def not_found(request, exception):
    """Django's 404 (a path no route matches), as JSON under /api/ as the API's own are."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request):
    """Django's 500, as JSON under /api/: a client reads the error the way it reads others."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Server error."}, status=500)
    return defaults.server_error(request)
