"""What the translated APIs share: server-sent events with ``event:`` lines, the text of
content, the chat answer's usage, and ``Framing``, a stream written in an API's shape."""

import json
import secrets

from ..errors import GatewayError


def sse(name: str, data: dict) -> bytes:
    """One server-sent event as both SDKs parse it: its name on an ``event:`` line (the
    Anthropic SDK skips an event without one), its JSON on one ``data:`` line."""
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(data).encode() + b"\n\n"


def new_id(prefix: str, seed: object = None) -> str:
    """An id in the API's style (``msg_...``, ``resp_...``): from the engine's
    ``chatcmpl-...`` where there is one, so the two can be matched in logs."""
    if isinstance(seed, str) and seed:
        return prefix + seed.removeprefix("chatcmpl-")
    return prefix + secrets.token_hex(12)


def refuse(message: str, param: str) -> GatewayError:
    return GatewayError(400, message, param=param)


def chat_tokens(usage: dict | None) -> tuple[int | None, int | None, int | None]:
    """(prompt, completion, cached prompt) tokens of a chat answer's ``usage``; None
    where it does not say."""
    if not isinstance(usage, dict):
        return None, None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
        cached if isinstance(cached, int) else None,
    )


def choice_of(event: dict) -> dict | None:
    """The first choice of a chat answer or chunk (these APIs have no ``n``)."""
    choices = event.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def matched_stop(choice: dict) -> str | None:
    """The stop sequence that ended a chat answer, where the engine says: vLLM's
    ``stop_reason``, SGLang's ``matched_stop`` (an int there is a token id, not a sequence)."""
    for name in ("stop_reason", "matched_stop"):
        value = choice.get(name)
        if isinstance(value, str):
            return value
    return None


def reasoning_of(delta: dict) -> str:
    """Reasoning text the engine kept apart from the answer (vLLM's ``reasoning``,
    llama.cpp's and SGLang's ``reasoning_content``)."""
    for name in ("reasoning_content", "reasoning"):
        value = delta.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def as_delta(answer: dict) -> dict:
    """A whole chat answer as the one chunk that would have streamed it."""
    choice = choice_of(answer) or {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    delta = dict(message)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        delta["tool_calls"] = [
            {**c, "index": i} for i, c in enumerate(calls) if isinstance(c, dict)
        ]
    out = {k: v for k, v in answer.items() if k not in ("choices", "object")}
    out["choices"] = [{**choice, "delta": delta}]
    return out


class Framing:
    """A request's answer written in its API's shape, kept for the whole request.

    ``translating`` is set for each replica tried (``proxy.forward``): where true,
    the engine's chat stream is fed in, chunk by chunk (``chunk``, then ``finish``
    at its ``[DONE]``), and the API's events come out; where false, the engine's
    own events pass through and ``passed`` counts them. ``fail`` writes an error
    event in the API's shape, fitting what was sent before it. The tokens the
    client is told are the tokens the gateway counts: ``usage`` (the engine's,
    in the chat's shape) or else ``pieces``, the chunks that carried output.
    """

    api = ""

    def __init__(self, req):
        self.req = req
        self.translating = False
        self.passed = 0  # events of the engine's own that reached the client
        self.usage: dict | None = None
        self.pieces = 0
        self.ended = False

    def chunk(self, event: dict) -> bytes:
        raise NotImplementedError

    def finish(self) -> bytes:
        raise NotImplementedError

    def fail(self, message: str, code: str = "upstream_error", status: int = 502) -> bytes:
        """The error event(s) that end this stream; ``status`` the one a whole answer
        would have had, for the error's type."""
        raise NotImplementedError

    def answer(self, chat: dict) -> dict:
        """A whole chat answer in the API's shape."""
        raise NotImplementedError

    def whole(self, chat: dict) -> bytes:
        """A whole chat answer as this stream's events (a stream already open
        while the request waited, answered whole)."""
        return self.chunk(as_delta(chat)) + self.finish()

    def take_usage(self, event: dict) -> None:
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
