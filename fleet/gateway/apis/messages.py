"""Anthropic's Messages API over an engine's chat completions, both ways.

The request (``to_chat``): ``system`` becomes the first message; each block of a
message its chat counterpart (text, images as data or URLs, ``tool_use`` as the
assistant's ``tool_calls``, ``tool_result`` as ``tool`` messages); ``tools`` and
``tool_choice`` OpenAI's; ``output_config.format`` (a JSON schema) the
``response_format``; ``max_tokens``, ``stop_sequences``, ``temperature``, ``top_p``,
``top_k`` and ``metadata.user_id`` theirs. ``thinking`` blocks the client sends
back are dropped (chat has no place for them), as are the ``thinking`` and
``output_config.effort`` settings. What has no chat counterpart (documents, server
tools, MCP servers) is a 400 naming it.

The answer (``Stream``): text, reasoning (as ``thinking`` blocks) and tool calls
as content blocks; ``finish_reason`` as ``stop_reason``; the usage as Anthropic
counts it (``input_tokens`` without the cached part, which is
``cache_read_input_tokens``). A stream is framed as Anthropic's: ``message_start``,
per block ``content_block_start``, ``content_block_delta``\\s and
``content_block_stop``, then ``message_delta`` (stop reason, usage) and
``message_stop``, each with its ``event:`` line.
"""

import json

from ..errors import anthropic_error
from .common import (
    Framing,
    chat_tokens,
    choice_of,
    matched_stop,
    new_id,
    reasoning_of,
    refuse,
    sse,
)

_ROLES = ("user", "assistant")

# finish_reason -> stop_reason; "stop" is end_turn unless a stop sequence matched.
_STOP = {"length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}


def check(body: dict) -> None:
    """What every /v1/messages request must be, whichever way it is served."""
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise refuse("'max_tokens' is required for /v1/messages", "max_tokens")
    for i, m in enumerate(body["messages"]):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise refuse(
                f"'messages[{i}]' must be an object with 'role' \"user\" or \"assistant\"",
                f"messages[{i}]",
            )
        if not isinstance(m.get("content"), str | list):
            raise refuse(
                f"'messages[{i}].content' must be a string or an array of content blocks",
                f"messages[{i}].content",
            )
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise refuse("'system' must be a string or an array of text blocks", "system")


# ---- the request --------------------------------------------------------------------


def _text_of(blocks, where: str) -> str:
    """The text of a string or of text blocks (``system``, a tool's result)."""
    if isinstance(blocks, str):
        return blocks
    out = []
    for i, b in enumerate(blocks if isinstance(blocks, list) else ()):
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str):
            out.append(b["text"])
        elif isinstance(b, dict) and b.get("type") == "image":
            raise refuse(
                f"'{where}[{i}]': an image in a tool result cannot be sent to this model's "
                "engine (it takes chat completions: text only there)",
                f"{where}[{i}]",
            )
        else:
            raise refuse(f"'{where}[{i}]' must be a text block", f"{where}[{i}]")
    return "\n".join(out)


def _image(block: dict, where: str) -> dict:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif isinstance(source, dict) and source.get("type") == "url":
        url = source.get("url")
    else:
        raise refuse(f"'{where}.source' must be a base64 or url image source", f"{where}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _message(m: dict, i: int) -> list[dict]:
    """One Anthropic message as chat messages: tool results first, as ``tool`` messages."""
    role, content = m["role"], m["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    parts, calls, results = [], [], []
    for j, b in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            parts.append(_image(b, where))
        elif kind == "tool_use" and role == "assistant":
            calls.append(
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input"))},
                }
            )
        elif kind == "tool_result" and role == "user":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id"),
                    "content": _text_of(b.get("content", ""), f"{where}.content"),
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the model's earlier reasoning: chat has no place for it
        else:
            raise refuse(
                f"'{where}': content block type {kind!r} cannot be sent to this model's engine "
                "(it takes chat completions: text, image, tool_use and tool_result blocks)",
                where,
            )
    out = results
    if parts or calls:
        if all(p["type"] == "text" for p in parts):
            # One string where it is all text: chat templates that expect one render it.
            text = "".join(p["text"] for p in parts)
            msg = {"role": role, "content": text if parts or not calls else None}
        else:
            msg = {"role": role, "content": parts}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _tools(tools) -> list[dict]:
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
            kind = t.get("type") if isinstance(t, dict) else t
            raise refuse(
                f"'tools[{i}]': tool type {kind!r} runs on Anthropic's servers, not on this "
                "model's engine; only client tools (name, description, input_schema) are served",
                f"tools[{i}]",
            )
        fn = {"name": t.get("name"), "parameters": t.get("input_schema") or {"type": "object"}}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: dict, chat: dict) -> None:
    kind = choice.get("type")
    if kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif kind in ("auto", "any", "none"):
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    else:
        raise refuse(
            f"'tool_choice.type' {kind!r} is not one of auto, any, tool, none", "tool_choice"
        )
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def to_chat(body: dict) -> dict:
    """The chat completion request that asks an engine what ``body`` asks; the 400 naming
    what has no counterpart there."""
    for name in ("mcp_servers", "container"):
        if body.get(name):
            raise refuse(
                f"'{name}' runs on Anthropic's servers; this model's engine has none", name
            )
    messages = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text_of(body["system"], "system")})
    for i, m in enumerate(body["messages"]):
        messages.extend(_message(m, i))
    chat = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    if body.get("tools"):
        if not isinstance(body["tools"], list):
            raise refuse("'tools' must be an array", "tools")
        chat["tools"] = _tools(body["tools"])
    if isinstance(body.get("tool_choice"), dict):
        _tool_choice(body["tool_choice"], chat)
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if isinstance(fmt, dict):
        if fmt.get("type") != "json_schema":
            raise refuse("'output_config.format.type' must be json_schema", "output_config")
        schema = {"name": "output", "schema": fmt.get("schema") or {}}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


# ---- the answer ---------------------------------------------------------------------


def usage_of(usage: dict | None, pieces: int = 0) -> dict:
    """Anthropic's usage from a chat answer's: the cached prompt apart. Without the
    engine's usage (llama-cpp-python's streams have none), the pieces of output
    streamed, and no prompt count (0: Anthropic's field is required)."""
    prompt, completion, cached = chat_tokens(usage)
    out = {
        "input_tokens": max(0, (prompt or 0) - (cached or 0)),
        "output_tokens": completion if completion is not None else pieces,
    }
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


def stop_of(choice: dict | None, used_tools: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a chat answer's choice."""
    finish = (choice or {}).get("finish_reason")
    if finish in _STOP:
        return _STOP[finish], None
    if finish not in (None, "stop"):
        return None, None  # "abort" and the like: Anthropic has no word for it
    sequence = matched_stop(choice or {})
    if sequence is not None:
        return "stop_sequence", sequence
    return ("tool_use" if used_tools else "end_turn"), None


def _input_of(arguments) -> dict:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}


class Stream(Framing):
    """An Anthropic message, whole or as its stream of events."""

    api = "messages"

    def __init__(self, req):
        super().__init__(req)
        self.started = False
        self.id = ""
        self.model = req.model
        self.index = -1  # the open content block's index (-1: none open)
        self.kind = ""  # its type: text, thinking, tool_use
        self.calls: dict[int, int] = {}  # the chat's tool call index -> its block's
        self.choice: dict | None = None  # the last choice with a finish_reason

    def answer(self, chat: dict) -> dict:
        choice = choice_of(chat) or {}
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        content = []
        if reasoning := reasoning_of(message):
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if isinstance(message.get("content"), str) and message["content"]:
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            content.append(
                {
                    "type": "tool_use",
                    "id": call.get("id") or new_id("toolu_"),
                    "name": fn.get("name"),
                    "input": _input_of(fn.get("arguments")),
                }
            )
        stop, sequence = stop_of(choice, any(b["type"] == "tool_use" for b in content))
        return {
            "id": new_id("msg_", chat.get("id")),
            "type": "message",
            "role": "assistant",
            "model": chat.get("model") or self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": sequence,
            "usage": usage_of(chat.get("usage")),
        }

    # -- a stream -------------------------------------------------------------------

    def _start(self, event: dict) -> bytes:
        self.started = True
        self.id = new_id("msg_", event.get("id"))
        self.model = event.get("model") or self.model
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage_of(self.usage), "output_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": message})

    def _close(self) -> bytes:
        if self.index < 0 or not self.kind:
            return b""
        self.kind = ""
        return sse("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _open(self, block: dict) -> bytes:
        out = self._close()
        self.index += 1
        self.kind = block["type"]
        return out + sse(
            "content_block_start",
            {"type": "content_block_start", "index": self.index, "content_block": block},
        )

    def _delta(self, index: int, delta: dict) -> bytes:
        self.pieces += 1
        return sse(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    def chunk(self, event: dict) -> bytes:
        self.take_usage(event)
        out = [] if self.started else [self._start(event)]
        choice = choice_of(event)
        if choice is None:
            return b"".join(out)
        if choice.get("finish_reason") is not None:
            self.choice = choice
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        if reasoning := reasoning_of(delta):
            if self.kind != "thinking":
                out.append(self._open({"type": "thinking", "thinking": "", "signature": ""}))
            out.append(self._delta(self.index, {"type": "thinking_delta", "thinking": reasoning}))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self.kind != "text":
                out.append(self._open({"type": "text", "text": ""}))
            out.append(self._delta(self.index, {"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            at = call.get("index", 0)
            if at not in self.calls:
                block = {
                    "type": "tool_use",
                    "id": call.get("id") or new_id("toolu_"),
                    "name": fn.get("name") or "",
                    "input": {},
                }
                out.append(self._open(block))
                self.calls[at] = self.index
            arguments = fn.get("arguments")
            if isinstance(arguments, str) and arguments:
                out.append(
                    self._delta(
                        self.calls[at], {"type": "input_json_delta", "partial_json": arguments}
                    )
                )
        return b"".join(out)

    def finish(self) -> bytes:
        out = [] if self.started else [self._start({})]
        out.append(self._close())
        stop, sequence = stop_of(self.choice, bool(self.calls))
        usage = usage_of(self.usage, self.pieces)
        if self.usage is None:
            del usage["input_tokens"]  # not known: the one message_start said stands
        out.append(
            sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": sequence},
                    "usage": usage,
                },
            )
        )
        out.append(sse("message_stop", {"type": "message_stop"}))
        self.ended = True
        return b"".join(out)

    def fail(self, message: str, code: str = "upstream_error", status: int = 502) -> bytes:
        """Anthropic's error event, as its API sends one mid-stream (its SDK raises it)."""
        self.ended = True
        return sse("error", anthropic_error(status, message))
