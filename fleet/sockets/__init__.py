"""The agents' WebSocket: the transport between each node's agent and the control plane.

``routing`` mounts ``consumer.AgentConsumer`` at ``/ws/agent/``; everything a
message means is decided by a service in ``fleet.services`` (registration,
heartbeat, desired, weights_gc.delivery), never here. These modules carry the
messages there and the answers back, and keep one socket, or thousands of them
coming back at once, from degrading the others.

The modules, in the order a socket meets them:

- ``peer``: the connection's own address, kept by the web process before proxy
  headers are read (the client-certificate check trusts only that).
- ``admission``: how many handshakes this process takes at once, and the
  ``Retry-After`` appointment the rest are given.
- ``consumer``: the socket itself: authentication, every message metered
  and validated against ``agentd.protocol``, then handed to its service.
- ``metering``: what one socket may send, messages and bytes a second
  (``TokenBucket``), charged before a message is parsed.
- ``events``: the doorbells (``node.*`` events) other processes ring, a mixin
  of the consumer.
- ``registrations``: registrations written in batches across sockets, and the
  grace period moving while the fleet comes back.
- ``db``: the few threads, each with its own database connection, that every
  socket's database work runs on, and ``NodeBatcher``, which writes what many
  sockets send alike (registrations, closed sockets) in one call.
- ``groups``: joining and leaving the nodes' channel-layer groups in pipelined
  batches, so a restart's thousands of sockets cost a few Redis round trips.

Adding a message: declare it in ``agentd.protocol``, write what it does as a
service, and give the consumer an ``on_<type>`` handler that validates, calls
the service through ``db`` (never on the event loop) and answers; test it over
a real socket (tests/consumer/).
"""
