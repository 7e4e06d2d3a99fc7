"""ASGI entry point: HTTP (admin, API) and the agents' WebSocket at /ws/agent/.

Run with ``daphne llmgw_site.asgi:application``.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from fleet.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # No origin check: agents are not browsers, and each one authenticates
        # with its own bearer credential before the socket is accepted.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
