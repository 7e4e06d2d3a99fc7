"""Anthropic's Messages API (/v1/messages) and OpenAI's Responses API (/v1/responses).

A request on either is checked (``fleet.gateway.validate``), admitted and routed
exactly as a chat completion is (``app``, ``proxy``): keys, allowed models,
limits, budgets, fair share, fallbacks, canaries, adapters, the wait for a
replica. Then, per replica tried, one of two ways:

- passed through, where its engine serves the API itself (``NATIVE``): the body
  goes to the engine's own /v1/messages or /v1/responses, and its answer comes
  back as it is; the usage is read from the API's own structure
  (``fleet.gateway.metrics.counts``, ``proxy.SSECheck``);
- translated, everywhere else: the request is rewritten as a chat completion
  (``messages.to_chat``, ``responses.to_chat``, made once when it is parsed), sent
  to the engine's /v1/chat/completions, and the answer is written back in the
  API's shape, a stream event by event (``Framing`` below).

Either way the errors the gateway makes are in the API's own shape: Anthropic's
``{"type": "error", ...}`` on /v1/messages (``errors.error_body``), OpenAI's on
/v1/responses; in a stream, the API's error event (``Framing.fail``).

Extending: another API is a module with ``check`` and ``to_chat`` (the request),
``from_chat`` (a whole answer) and a ``Framing`` subclass (a stream), listed in
``_MODULES`` and in ``app.PROXIED``; ``NATIVE`` names the engines that serve it
themselves, each checked against that engine's source.
"""

from . import messages, responses
from .common import Framing

__all__ = ["NATIVE", "Framing", "api_of", "framing", "module", "native"]

# Engines that serve each API themselves, checked against their source: vLLM 0.32.0
# registers /v1/messages (vllm/entrypoints/anthropic/api_router.py) and /v1/responses
# (vllm/entrypoints/openai/responses/api_router.py) for every generating model
# (vllm/entrypoints/generate/api_router.py). llama-cpp-python's server (0.3.36)
# serves neither; llama-server's and SGLang's support depends on their version,
# which the gateway does not know: those are translated, as is the fake engine.
NATIVE = {
    "messages": frozenset({"vllm"}),
    "responses": frozenset({"vllm"}),
}

_MODULES = {"messages": messages, "responses": responses}


def module(endpoint: str):
    """The module translating ``endpoint`` ("messages", "responses"); None for the others."""
    return _MODULES.get(endpoint)


def native(engine: str, endpoint: str) -> bool:
    """Whether an engine of kind ``engine`` serves ``endpoint`` itself."""
    return engine in NATIVE.get(endpoint, ())


def api_of(path: str) -> str | None:
    """The API whose error shape a path's answers take: "messages" for /v1/messages and
    below (Anthropic's), None for OpenAI's."""
    return "messages" if path == "/v1/messages" or path.startswith("/v1/messages/") else None


def framing(req) -> Framing | None:
    """How a request's answer is written in its API (``Framing``); None for chat,
    completions and embeddings, which pass through as they are."""
    mod = _MODULES.get(req.endpoint)
    return None if mod is None else mod.Stream(req)
