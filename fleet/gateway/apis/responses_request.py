"""OpenAI's Responses API request as a chat completion (``to_chat``); and what llmgw
refuses on it because it keeps no state (``check``).

llmgw keeps no responses: each request may go to another replica, and none is
stored. So ``previous_response_id``, ``conversation``, a stored ``prompt``,
``store: true`` (kept for a later ``previous_response_id`` or a GET) and
``background: true`` (fetched later) are each a 400 naming the field, whichever
way the request is served (``check``); clients send the conversation in
``input`` instead, as they do with ``store: false``.

The request (``to_chat``): ``instructions`` becomes the system message; ``input``
a string, or items: messages (``developer`` as ``system``), ``function_call`` and
``function_call_output`` as the chat's tool calls and ``tool`` messages;
``reasoning`` items are dropped. Function ``tools``, ``tool_choice``,
``text.format`` (as ``response_format``), ``max_output_tokens``, ``temperature``,
``top_p``, ``parallel_tool_calls`` and ``user`` map to theirs; built-in tools
(web search, file search, code interpreter, MCP...) run on OpenAI's servers and
are a 400. The answer is ``responses``'s.
"""

from .common import refuse

# Fields that ask llmgw to keep or fetch state, and why each cannot be honoured.
_STATEFUL = {
    "previous_response_id": "llmgw keeps no responses (each request may go to another "
    "replica); send the conversation so far in 'input' instead",
    "conversation": "llmgw keeps no conversations; send the conversation so far in 'input' instead",
    "prompt": "llmgw keeps no stored prompts; send the instructions and input themselves",
}


def check(body: dict) -> None:
    """What every /v1/responses request must be, whichever way it is served."""
    for name, why in _STATEFUL.items():
        if body.get(name) is not None:
            raise refuse(f"'{name}' cannot be honoured: {why}", name)
    if body.get("store") is True:
        raise refuse(
            "'store': true cannot be honoured: llmgw keeps no responses to fetch or continue "
            "later; send 'store': false or leave it out",
            "store",
        )
    if body.get("background") is True:
        raise refuse(
            "'background': true cannot be honoured: llmgw keeps no responses to fetch later; "
            "leave it out and wait for the answer, or stream it",
            "background",
        )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise refuse("'instructions' must be a string", "instructions")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise refuse("'max_output_tokens' must be an integer of at least 1", "max_output_tokens")


_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _content(content, where: str):
    """A message's content for chat: its text as one string where it is all text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refuse(f"'{where}' must be a string or an array of content parts", where)
    parts = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in _TEXT_PARTS:
            text = p.get("refusal") if kind == "refusal" else p.get("text")
            parts.append({"type": "text", "text": text if isinstance(text, str) else ""})
        elif kind == "input_image" and isinstance(p.get("image_url"), str):
            image = {"url": p["image_url"]}
            if p.get("detail") in ("low", "high", "auto"):
                image["detail"] = p["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            what = "a file id" if kind == "input_image" else f"content part type {kind!r}"
            raise refuse(
                f"'{where}[{j}]': {what} cannot be sent to this model's engine (it takes chat "
                "completions: text, and images by URL or data URL)",
                f"{where}[{j}]",
            )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _items(items: list) -> list[dict]:
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise refuse(f"'{where}' must be an object", where)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise refuse(f"'{where}.role' must be user, assistant, system or developer", where)
            role = "system" if role == "developer" else role
            out.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""},
            }
            last = out[-1] if out else None
            # Calls after the assistant's text, or after each other, are one chat turn.
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{where}.output")
            if not isinstance(text, str):
                raise refuse(f"'{where}.output': only text goes back to the engine", where)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # the model's earlier reasoning: chat has no place for it
        else:
            why = (
                "it names an item llmgw did not keep"
                if kind == "item_reference"
                else "this model's engine takes chat completions: messages, function calls "
                "and their outputs"
            )
            raise refuse(f"'{where}': input item type {kind!r} cannot be served: {why}", where)
    return out


def _tools(tools: list) -> list[dict]:
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else t
            raise refuse(
                f"'tools[{i}]': tool type {kind!r} runs on OpenAI's servers, not on this "
                "model's engine; only function tools are served",
                f"tools[{i}]",
            )
        fn = {"name": t.get("name"), "parameters": t.get("parameters") or {"type": "object"}}
        for name in ("description", "strict"):
            if t.get(name) is not None:
                fn[name] = t[name]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise refuse("'tool_choice' must be auto, none, required or a function by name", "tool_choice")


def _response_format(fmt: dict):
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {"name": fmt.get("name") or "answer", "schema": fmt.get("schema") or {}}
        for name in ("description", "strict"):
            if fmt.get(name) is not None:
                schema[name] = fmt[name]
        return {"type": "json_schema", "json_schema": schema}
    raise refuse(f"'text.format.type' {kind!r} is not text, json_object or json_schema", "text")


def to_chat(body: dict) -> dict:
    """The chat completion request that asks an engine what ``body`` asks; the 400 naming
    what has no counterpart there."""
    messages = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body["input"]
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    else:
        messages.extend(_items(given))
    chat = {"model": body["model"], "messages": messages}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("tools"):
        if not isinstance(body["tools"], list):
            raise refuse("'tools' must be an array", "tools")
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        fmt = _response_format(text["format"])
        if fmt is not None:
            chat["response_format"] = fmt
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat
