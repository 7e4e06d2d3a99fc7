"""A gateway-only ASGI entry point: /v1/* and /metrics, without Django's HTTP stack
(but for the Batch API's /v1/files and /v1/batches, which are Django views).

For a site that wants gateway processes apart from the web processes
(``python -m llmgw_site.serve``, which serves the whole app, the gateway
included, on the same server and as fast: docs/gateway.md, "Serving")::

    uvicorn llmgw_site.gateway_asgi:application --loop uvloop --http httptools

Every process reads the same settings and database as the main app and
hears the same channel-layer doorbells.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
django.setup()

from fleet.batch_api import edge as batch_edge  # noqa: E402
from fleet.gateway.app import application as gateway_app  # noqa: E402
from fleet.gateway.errors import error_body  # noqa: E402
from fleet.metrics import metrics_app  # noqa: E402

_django_app = None


def _django():
    global _django_app
    if _django_app is None:
        from django.core.asgi import get_asgi_application

        _django_app = get_asgi_application()
    return _django_app


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        return await gateway_app(scope, receive, send)
    if scope["type"] == "websocket":
        # Agents connect to the main app (llmgw_site.asgi), never here.
        await send({"type": "websocket.close", "code": 4404})
        return
    path = scope["path"]
    if path.startswith("/v1/"):
        if batch_edge.handles(path):
            # The Batch API is Django's views, served here too: a site that sends all of
            # /v1 to its gateway processes keeps it.
            return await batch_edge.bounded(_django(), scope, receive, send)
        return await gateway_app(scope, receive, send)
    if path == "/metrics":
        return await metrics_app(scope, receive, send)
    body = error_body(404, f"unknown path {path}: this process serves only /v1/* and /metrics")
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
