"""The management API (``/api/v1/``): a package per domain, joined by ``urls.py``.

Each domain has its ``serializers.py`` (how its rows read and what its actions take),
``views.py`` (its viewsets, thin over fleet/services/) and, where its lists are
narrowed, ``filters.py``:

- ``nodes``: nodes, their GPUs, the engines every node installs;
- ``catalog``: models, engine profiles, the catalog file (apply, explain);
- ``adapters``: LoRA adapters;
- ``workload``: replicas, shards, events;
- ``access``: join tokens, API keys, the tokens keys used;
- ``audit``: the audit trail;
- ``teams``: teams, their quotas and budgets;
- ``weights``: weights on nodes and their clean-up;
- ``costs``: prices, and the cost report (JSON or CSV).

What more than one domain uses is in ``common.py`` (strict fields, the serializer that
runs ``full_clean()``, the base of filter sets, 409 and 504); how a request is let in,
paged, refused and described is in ``authentication.py``, ``permissions.py``,
``pagination.py``, ``exceptions.py`` and ``schema.py``.

A new resource goes in its domain's package and is registered in ``urls.py``; a new
domain is a package like these. Route names, basenames and the schema's operation ids
and components come from the routes and the classes' names, not from where they live.
"""
