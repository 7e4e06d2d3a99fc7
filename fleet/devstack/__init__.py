"""The dev stack `make run` starts: the whole of llmgw on one machine, without hardware.

- ``stack``: the orchestrator, ``python -m fleet.devstack`` (Redis, the web process on
  uvicorn, Celery, an agent);
- ``node``: the local agent's config, the demo model and how to call it;
- ``redis``: the embedded default's private Redis, ``python -m fleet.devstack.redis exec -- CMD``.

The demo model is a tiny llama GGUF real llama.cpp serves on a CPU, written by
``agentd.tinygguf`` (the one GGUF writer; the agent verifies llama.cpp installs with it).

Nothing is imported here, and none of these modules imports Django at import time: the
tests and the benchmarks take the Redis without a configured project,
and ``stack`` sets Django up itself once its Redis is up. Keep it so: a new piece of the
dev stack is a module here that imports Django inside its functions.
"""
