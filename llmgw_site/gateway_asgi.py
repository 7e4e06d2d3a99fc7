"""A gateway-only ASGI entry point: /v1/* and /metrics, without Django's HTTP stack.

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

from fleet.gateway.app import application as gateway_app  # noqa: E402
from fleet.gateway.errors import error_body  # noqa: E402
from fleet.metrics import metrics_app  # noqa: E402


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        return await gateway_app(scope, receive, send)
    if scope["type"] == "websocket":
        # Agents connect to the main app (llmgw_site.asgi), never here.
        await send({"type": "websocket.close", "code": 4404})
        return
    path = scope["path"]
    if path.startswith("/v1/"):
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
