"""Anthropic's Messages API (/v1/messages) and OpenAI's Responses API (/v1/responses);
and which engines serve which API themselves, rerank and score included (``NATIVE``).

A request on either is checked (``fleet.gateway.validate``), admitted and routed
exactly as a chat completion is (``app``, ``proxy``): keys, allowed models,
limits, budgets, fair share, fallbacks, canaries, adapters, the wait for a
replica. Then, per replica tried, one of two ways:

- passed through, where its engine serves the API itself (``NATIVE``): the body
  goes to the engine's own /v1/messages or /v1/responses, and its answer comes
  back as it is; the usage is read from the API's own structure
  (``fleet.gateway.metrics.counts``, ``answers.SSECheck``);
- translated, everywhere else: the request is rewritten as a chat completion
  (``messages.to_chat``, ``responses_request.to_chat``, made once when it is parsed), sent
  to the engine's /v1/chat/completions, and the answer is written back in the
  API's shape, a stream event by event (``Framing`` below).

Either way the errors the gateway makes are in the API's own shape: Anthropic's
``{"type": "error", ...}`` on /v1/messages (``errors.error_body``), OpenAI's on
/v1/responses; in a stream, the API's error event (``Framing.fail``).

/v1/rerank and /v1/score have no chat counterpart: they go only to replicas whose
engine serves them, and a replica that does not is a 400 naming its engine
(``unsupported``), never a guess.

Extending: another API has ``check`` and ``to_chat`` (the request), listed in
``_REQUESTS``, and a ``Framing`` subclass (its answer, whole and as a stream), listed
in ``_FRAMINGS``; in one module, or two where each side is large (``responses_request``
and ``responses``); and in ``app.PROXIED``. ``NATIVE`` names the engines that serve it
themselves, each checked against that engine's source.
"""

from ..errors import GatewayError
from . import messages, responses, responses_request
from .common import Framing

__all__ = [
    "NATIVE",
    "PASSED_ONLY",
    "Framing",
    "api_of",
    "framing",
    "module",
    "native",
    "unsupported",
]

# Engines that serve each API themselves, checked against their source: vLLM 0.32.0
# registers /v1/messages (vllm/entrypoints/anthropic/api_router.py) and /v1/responses
# (vllm/entrypoints/openai/responses/api_router.py) for every generating model
# (vllm/entrypoints/generate/api_router.py). llama-cpp-python's server (0.3.36)
# serves neither; llama-server's and SGLang's support depends on their version,
# which the gateway does not know: those are translated, as is the fake engine.
#
# /v1/rerank and /v1/score, for a model that scores (a cross-encoder, a reranker): vLLM
# 0.32.0 serves both (vllm/entrypoints/pooling/scoring/api_router.py), SGLang /v1/rerank
# (python/sglang/srt/entrypoints/http_server.py; its /v1/score is another API, with
# another body), the fake engine both as vLLM does; llama-cpp-python's server neither.
NATIVE = {
    "messages": frozenset({"vllm"}),
    "responses": frozenset({"vllm"}),
    "rerank": frozenset({"vllm", "sglang", "fake"}),
    "score": frozenset({"vllm", "fake"}),
}
# Served only where the engine serves them: a chat completion cannot stand in.
PASSED_ONLY = ("rerank", "score")

_ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp", "fake": "fake"}
_OTHER_API = {("sglang", "score"): "serves another API there, with another body"}

# Each API's request side (``check``, ``to_chat``), and its answer's (a ``Framing``).
_REQUESTS = {"messages": messages, "responses": responses_request}
_FRAMINGS = {"messages": messages.Stream, "responses": responses.Stream}


def module(endpoint: str):
    """The module checking and translating requests to ``endpoint`` ("messages",
    "responses"): its ``check`` and ``to_chat``; None for the others."""
    return _REQUESTS.get(endpoint)


def native(engine: str, endpoint: str) -> bool:
    """Whether an engine of kind ``engine`` serves ``endpoint`` itself."""
    return engine in NATIVE.get(endpoint, ())


def unsupported(model: str, replica: str, engine: str, endpoint: str) -> GatewayError:
    """The 400 for a request no engine of this replica's kind serves (``PASSED_ONLY``)."""
    able = [_ENGINE_NAMES[e] for e in sorted(NATIVE[endpoint]) if e != "fake"]
    runs = _ENGINE_NAMES.get(engine, engine or "an engine of unknown kind")
    why = _OTHER_API.get((engine, endpoint), "does not serve it")
    return GatewayError(
        400,
        f"model '{model}' cannot be served /v1/{endpoint}: its replica {replica} runs {runs}, "
        f"which {why} ({' and '.join(able)} {'do' if len(able) > 1 else 'does'}, for a "
        "model that scores)",
        param="model",
        code="unsupported_endpoint",
    )


def api_of(path: str) -> str | None:
    """The API whose error shape a path's answers take: "messages" for /v1/messages and
    below (Anthropic's), None for OpenAI's."""
    return "messages" if path == "/v1/messages" or path.startswith("/v1/messages/") else None


def framing(req) -> Framing | None:
    """How a request's answer is written in its API (``Framing``); None for chat,
    completions and embeddings, which pass through as they are."""
    stream = _FRAMINGS.get(req.endpoint)
    return None if stream is None else stream(req)
