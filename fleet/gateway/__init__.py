"""The OpenAI-compatible gateway: /v1/* routed to ready replicas from an in-memory table.

``app.application`` is the ASGI app; ``fleet.services.doorbells.ring_gateways()``
tells every gateway process to refresh its table and keys. Every /v1 request takes
one path, through the ASGI app, so each rule below exists once.

The modules, in the order a request meets them:

- ``app``: the ASGI entry; reads the body within its endpoint's limit, admits the
  request, watches for its client going away, and answers /v1/models.
- ``keys``: API keys from an in-memory cache; checked before the body is read.
- ``validate``: the body's shape, a clear 400 before it goes anywhere.
- ``apis``: Anthropic's Messages API and OpenAI's Responses API (its request and
  its answer in a module each): passed through to engines that serve them,
  translated to and from chat completions for the others; which engines serve
  rerank and score.
- ``ratelimit``: the per-key limits, shared by every process through Redis: the
  checks of a loop turn in one call, none for a key far from its limits (a lease,
  ``limit_leases``); a key's limits, their windows and the headers and 429 a check's
  figures make, in ``limit_answers``.
- ``table``: the routing table (ready replicas per model, and why others are not).
- ``waiting``: the wait for a replica of a model scaled to zero, and the load
  each process reports for the autoscaler.
- ``prefix``: which replica has the prompt's prefix cached.
- ``choice``: which replica an attempt goes to: the least busy, the prefix's, the
  canary's share.
- ``fair``: room on a busy model: a request waits its turn in fair order across
  keys, a batch's line takes only what interactive requests leave.
- ``proxy``: the attempts at a replica, retries, the answer back whole or
  streamed, and counting its tokens; ``outgoing``, the body the engine is sent;
  ``upstream``, the HTTP client to the engines (its connections pooled and
  reused), and ``http1``, one exchange on a connection, read within its bounds;
  ``answers``, the usage and the stream's framing read from an answer;
  ``failures``, how a failed attempt is counted and what the client is told.
- ``usage``: tokens per key, model and hour, counted in memory, written in batches.
- ``engines``: what the engines say is queued, scraped for the queue depth.
- ``state``: one ``Gateway`` per event loop and the tasks that keep it fresh;
  ``limits``, its bounds, timeouts and periods, read once from the settings.
- ``errors`` and ``metrics``: OpenAI's error shape (Anthropic's on /v1/messages), and
  the figures on /metrics.

Adding a rule: put it where the request meets it above, in the ASGI path, and
test it through a real web process (tests/gateway/).
"""
