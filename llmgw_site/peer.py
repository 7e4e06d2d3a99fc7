"""The address a socket's TCP connection really came from, kept in the ASGI scope under Daphne.

Daphne run with ``--proxy-headers`` (as behind a load balancer it should be,
so login throttling sees clients) puts the first ``X-Forwarded-For`` address in
the scope's ``client``: a value any client can write, since a proxy that
appends to the header keeps what the client sent in front. A decision that
trusts an address — a client certificate's subject passed by a proxy
(``fleet.services.access.client_cert_node``) — needs the connection's own.
``install()`` keeps it in ``scope["extensions"]["llmgw.peer"]`` for WebSocket
scopes; ``connection_peer`` reads it. ``llmgw_site.asgi`` installs it, which
Daphne imports before it listens.
"""

import logging

logger = logging.getLogger(__name__)

PEER_KEY = "llmgw.peer"


def install() -> bool:
    """Make Daphne record each WebSocket's own peer address. Idempotent; False if it cannot."""
    try:
        from daphne.server import Server
    except ImportError:
        return False
    if getattr(Server.create_application, "_llmgw_peer", False):
        return True
    original = Server.create_application

    def create_application(self, protocol, scope):
        if scope.get("type") == "websocket":
            transport = getattr(protocol, "transport", None)
            peer = transport.getPeer() if transport is not None else None
            host = getattr(peer, "host", None)
            if isinstance(host, str):
                scope["extensions"] = {**(scope.get("extensions") or {}), PEER_KEY: host}
        return original(self, protocol, scope)

    create_application._llmgw_peer = True
    Server.create_application = create_application
    return True


def connection_peer(scope) -> str | None:
    """The connection's own address: what ``install`` kept, else the scope's ``client``.

    The fallback is for servers that do not rewrite ``client`` from a header
    (channels' test communicator, a server without proxy headers).
    """
    kept = (scope.get("extensions") or {}).get(PEER_KEY)
    if kept:
        return kept
    client = scope.get("client")
    return client[0] if client else None
