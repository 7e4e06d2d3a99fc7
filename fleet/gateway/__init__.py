"""The OpenAI-compatible gateway: /v1/* routed to ready replicas from an in-memory table.

``app.application`` is the ASGI app; ``fleet.services.doorbells.ring_gateways()``
tells every gateway process to refresh its table and keys.
"""
