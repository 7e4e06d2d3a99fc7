"""The address a socket's TCP connection really came from, kept in the ASGI scope.

Behind a load balancer the web process trusts ``X-Forwarded-For`` from it
(``--forwarded-allow-ips``), so login throttling sees clients; the scope's
``client`` is then an address from that header, which any client can write,
since a proxy that appends to the header keeps what the client sent in front. A
decision that trusts an address — a client certificate's subject passed by a
proxy (``fleet.services.access.client_cert_node``) — needs the connection's own.
``llmgw_site.serve`` keeps it in ``scope["extensions"]["llmgw.peer"]`` for
WebSocket scopes before the proxy headers are read; ``connection_peer`` reads it.
"""

PEER_KEY = "llmgw.peer"


def connection_peer(scope) -> str | None:
    """The connection's own address: what the web process kept, else the scope's ``client``.

    The fallback is for servers that do not rewrite ``client`` from a header
    (channels' test communicator, a server without proxy headers).
    """
    kept = (scope.get("extensions") or {}).get(PEER_KEY)
    if kept:
        return kept
    client = scope.get("client")
    return client[0] if client else None
