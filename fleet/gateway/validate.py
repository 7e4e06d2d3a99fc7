"""Checking a request body before it goes anywhere: a clear 400 beats an engine's stack trace.

Only what the gateway itself relies on, and the common fields whose wrong
type would otherwise surface as an engine error: the engine checks the rest.
"""

import json
from dataclasses import dataclass

from .errors import GatewayError

_NUMBER = (int, float)

# The fields every endpoint shares, and their types; None is always allowed
# for an optional field, as OpenAI allows it.
_COMMON = {
    "model": str,
    "stream": bool,
    "max_tokens": int,
    "max_completion_tokens": int,
    "n": int,
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "presence_penalty": _NUMBER,
    "frequency_penalty": _NUMBER,
    "seed": int,
    "stop": (str, list),
    "user": str,
    "stream_options": dict,
}

_TYPE_NAMES = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    _NUMBER: "a number",
    (str, list): "a string or an array",
    dict: "an object",
    list: "an array",
}

# What each endpoint requires besides "model".
_REQUIRED = {
    "chat/completions": ("messages", list),
    "completions": ("prompt", (str, list)),
    "embeddings": ("input", (str, list)),
}


@dataclass
class ParsedRequest:
    endpoint: str  # "chat/completions", "completions", "embeddings"
    body: dict
    raw: bytes
    model: str
    stream: bool


def _type_ok(value, expected) -> bool:
    # bool is an int in Python, never in JSON Schema: "max_tokens": true is wrong.
    if isinstance(value, bool) and expected is not bool:
        return False
    return isinstance(value, expected)


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def parse(endpoint: str, raw: bytes) -> ParsedRequest:
    if not raw.strip():
        raise GatewayError(400, "the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except UnicodeDecodeError:
        raise GatewayError(400, "the request body is not UTF-8 encoded JSON") from None
    except json.JSONDecodeError as exc:
        raise GatewayError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise GatewayError(400, f"the request body must be a JSON object, not {_json_type(body)}")
    # Over the body's keys, not the table's: a request has a handful.
    for name, value in body.items():
        expected = _COMMON.get(name)
        if expected is not None and value is not None and not _type_ok(value, expected):
            raise GatewayError(
                400,
                f"'{name}' must be {_TYPE_NAMES[expected]}, not {_json_type(value)}",
                param=name,
            )
    model = body.get("model")
    if not model:
        raise GatewayError(400, "'model' is required: name the model to use", param="model")
    name, expected = _REQUIRED[endpoint]
    value = body.get(name)
    if value is None:
        raise GatewayError(400, f"'{name}' is required for /v1/{endpoint}", param=name)
    if not _type_ok(value, expected):
        raise GatewayError(
            400, f"'{name}' must be {_TYPE_NAMES[expected]}, not {_json_type(value)}", param=name
        )
    if endpoint == "chat/completions":
        if not value:
            raise GatewayError(400, "'messages' must not be empty", param="messages")
        for i, m in enumerate(value):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise GatewayError(
                    400,
                    f"'messages[{i}]' must be an object with a string 'role'",
                    param=f"messages[{i}]",
                )
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and value < 1:
            raise GatewayError(400, f"'{name}' must be at least 1, not {value}", param=name)
    return ParsedRequest(endpoint, body, raw, model, bool(body.get("stream")))
