"""ASGI entry point: the gateway (/v1/*), /metrics, HTTP (admin, API) and the agents' WebSocket.

Served by uvicorn through ``python -m llmgw_site.serve`` (`make run`, production);
``manage.py runserver`` serves it on Daphne in development.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
django_asgi_app = get_asgi_application()

from django.conf import settings  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402

if not settings.DEBUG and not settings.ALLOWED_HOSTS:
    # Django would answer every request 400; say why once, at start, instead.
    raise ImproperlyConfigured(
        "ALLOWED_HOSTS is not set and DEBUG is off: set ALLOWED_HOSTS to the host names "
        "this control plane is reached by, comma-separated (e.g. ALLOWED_HOSTS=llmgw.example.com)"
    )

from django.contrib.staticfiles.storage import (  # noqa: E402
    ManifestFilesMixin,
    staticfiles_storage,
)

if (
    not settings.DEBUG
    and isinstance(staticfiles_storage, ManifestFilesMixin)
    and not staticfiles_storage.manifest_storage.exists(staticfiles_storage.manifest_name)
):
    # Every page naming a static file would be a 500 (the names come from the
    # manifest collectstatic writes): say what to run once, at start, instead.
    raise ImproperlyConfigured(
        f"the static files are not collected: {settings.STATIC_ROOT}/"
        f"{staticfiles_storage.manifest_name} is missing, and without it every admin page "
        "is a 500. Run: python manage.py collectstatic --no-input (with this process's "
        "environment; `make run` does it), then start this again"
    )

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from fleet.gateway.app import application as gateway_app  # noqa: E402
from fleet.metrics import metrics_app  # noqa: E402
from fleet.routing import websocket_urlpatterns  # noqa: E402


async def http_app(scope, receive, send):
    """The gateway and /metrics go ahead of Django: no middleware, no ORM per request."""
    path = scope["path"]
    if path.startswith("/v1/"):
        return await gateway_app(scope, receive, send)
    if path == "/metrics":
        return await metrics_app(scope, receive, send)
    return await django_asgi_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_app,
        # The server's start and stop: the gateway's usage counts are written on
        # a clean stop.
        "lifespan": gateway_app,
        # No origin check: agents are not browsers, and each one authenticates
        # with its own bearer credential before the socket is accepted.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
