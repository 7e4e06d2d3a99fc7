"""ASGI entry point: the gateway (/v1/*), /metrics, HTTP (admin, API) and the agents' WebSocket.

Served by uvicorn through ``python -m llmgw_site.serve`` (`make run`, production);
``manage.py runserver`` serves it on Daphne in development.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
django_asgi_app = get_asgi_application()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402

from llmgw_site.startup import refusal  # noqa: E402

if (why := refusal()) is not None:
    raise ImproperlyConfigured(why)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from fleet.batch_api import edge as batch_edge  # noqa: E402
from fleet.gateway.app import application as gateway_app  # noqa: E402
from fleet.metrics import metrics_app  # noqa: E402
from fleet.routing import websocket_urlpatterns  # noqa: E402


async def http_app(scope, receive, send):
    """The gateway and /metrics go ahead of Django: no middleware, no ORM per request."""
    path = scope["path"]
    if path.startswith("/v1/"):
        if batch_edge.handles(path):  # the Batch API: Django's views, bodies bounded first
            return await batch_edge.bounded(django_asgi_app, scope, receive, send)
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
