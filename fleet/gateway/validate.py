"""Checking a request body before it goes anywhere: a clear 400 beats an engine's stack trace.

Only what the gateway itself relies on, and the common fields whose wrong
type would otherwise surface as an engine error: the engine checks the rest.

Where a body is parsed (``read``): on the event loop while that is cheap for
any body of its kind, at most ``ON_LOOP_MAX_BYTES`` with at most
``ON_LOOP_MAX_CONTAINERS`` brackets (about a millisecond whatever it holds);
otherwise on the gateway's body thread, so a large body cannot hold up the
other requests (their limit checks included). The thread's decoder calls
Python for every number and object, so the interpreter can switch back to the
loop while it works; arrays have no such hook, so a body may hold at most
``MAX_CONTAINERS`` arrays and objects (a 400 past it). Every door that parses
a body asks ``on_loop`` first.
"""

import asyncio
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import apis
from .errors import GatewayError

_NUMBER = (int, float)

# Deeper than any real request (a tool's JSON schema is a dozen levels), and
# far from Python's recursion limit, so the body can be written out again.
MAX_DEPTH = 64
_CONTAINERS = (dict, list)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range for a JSON number")
    return value


def _depth_over(value, limit: int) -> bool:
    """Whether containers nest deeper than ``limit``; iterative, so it cannot recurse itself."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if node.__class__ is dict else node:
            if child.__class__ in _CONTAINERS:
                stack.append((child, depth + 1))
    return False


# One decoder for every request: json.loads with hooks builds a new one (and its
# scanner) per call. It decodes the bytes as json.loads does: UTF-8, -16 or -32.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def yielding_int(text: str) -> int:
    return int(text)


def yielding_object(pairs) -> dict:
    return dict(pairs)


# The body thread's: the same result, with a call into Python per number and
# object, where the interpreter may hand the loop its turn (C alone never does).
_YIELDING_DECODER = json.JSONDecoder(
    parse_constant=_no_constant,
    parse_float=_finite_float,
    parse_int=yielding_int,
    object_pairs_hook=yielding_object,
)

# A body this small with this few brackets is parsed on the event loop: about a
# millisecond at worst (16 KiB of "[[],[],…" or of digits), less than the
# thread's round trip costs a typical request. Anything else goes to the thread.
ON_LOOP_MAX_BYTES = 64 << 10
ON_LOOP_MAX_CONTAINERS = 4096
# Arrays and objects in one body: far more than a real request has (a chat of
# 20,000 messages, a batch of 2,048 embedding inputs), and each costs the
# process about 0.2 µs that nothing can interrupt, the loop's turn included.
MAX_CONTAINERS = 100_000

# One thread per process: large bodies queue for it rather than compete with the
# loop (and each other) for the interpreter.
_BODY_THREAD = ThreadPoolExecutor(1, thread_name_prefix="llmgw-body")


def on_loop(raw: bytes) -> bool:
    """Whether ``raw`` is cheap enough to parse on the event loop (``read`` decides by it)."""
    return len(raw) <= ON_LOOP_MAX_BYTES and (
        raw.count(b"[") + raw.count(b"{") <= ON_LOOP_MAX_CONTAINERS
    )


async def off_loop(fn, *args):
    """``fn(*args)`` on the body thread: for work on a large body or answer."""
    return await asyncio.get_running_loop().run_in_executor(_BODY_THREAD, fn, *args)


async def read(endpoint: str, raw: bytes) -> "ParsedRequest":
    """``parse``, on the loop where ``on_loop`` says so, else on the body thread."""
    if on_loop(raw):
        return parse(endpoint, raw)
    return await off_loop(_parse, endpoint, raw, _YIELDING_DECODER)


_CHUNK = 1 << 20


def _containers(text: str) -> int:
    """The arrays and objects of a JSON text: its brackets outside strings.

    In pieces of ``_CHUNK``, so no one call holds the interpreter long. Valid
    JSON has backslashes only inside strings: without escaped backslashes and
    quotes, every quote left opens or closes one.
    """
    text = text.replace("\\\\", "").replace('\\"', "")
    inside = False
    n = 0
    for start in range(0, len(text), _CHUNK):
        pieces = text[start : start + _CHUNK].split('"')
        outside = "".join(pieces[1::2] if inside else pieces[0::2])
        n += outside.count("[") + outside.count("{")
        inside ^= len(pieces) % 2 == 0
    return n


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
    (str, dict): "a string or an object",
    (str, list, dict): "a string, an array or an object",
    dict: "an object",
    list: "an array",
}

# What each endpoint requires besides "model".
_REQUIRED = {
    "chat/completions": ("messages", list),
    "completions": ("prompt", (str, list)),
    "embeddings": ("input", (str, list)),
    "messages": ("messages", list),
    "responses": ("input", (str, list)),
    "rerank": ("query", (str, dict)),
}

# /v1/score's two sides, in each of the spellings vLLM takes (its ScoreRequest).
_SCORE_SIDES = (
    ("text_1", "text_2"),
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
)


@dataclass
class ParsedRequest:
    # "chat/completions", "completions", "embeddings", "messages", "responses", "rerank",
    # "score"
    endpoint: str
    body: dict
    raw: bytes
    model: str
    stream: bool
    # /v1/messages and /v1/responses: the request as a chat completion, for engines that
    # do not serve the API themselves (fleet.gateway.apis); or, where it has no chat
    # counterpart, the 400 that says so, raised only if such an engine is tried.
    chat: dict | None = None
    chat_error: GatewayError | None = None


def _score_sides(body: dict) -> tuple[str, tuple]:
    """The first side of a /v1/score request (the side that names the spelling); the
    400 when it has none."""
    for first, _ in _SCORE_SIDES:
        if first in body:
            return first, (str, list, dict)
    raise GatewayError(
        400,
        "/v1/score takes two sides to score: 'text_1' and 'text_2', 'queries' and "
        "'documents' (or 'items'), or 'data_1' and 'data_2'",
        param="text_1",
    )


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
    """The request in ``raw``, checked; the 400 that says what is wrong with it.

    Any thread; on the event loop only where ``on_loop`` says so (``read``).
    """
    return _parse(endpoint, raw, _DECODER)


def _parse(endpoint: str, raw: bytes, decoder: json.JSONDecoder) -> ParsedRequest:
    if not raw or raw.isspace():  # as ``not raw.strip()``, without copying a large body
        raise GatewayError(400, "the request body is empty; send a JSON object")
    brackets = raw.count(b"[") + raw.count(b"{")
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        if brackets > MAX_CONTAINERS and _containers(text) > MAX_CONTAINERS:
            raise GatewayError(
                400,
                f"the request body has more than {MAX_CONTAINERS} arrays and objects",
            )
        # NaN and Infinity are Python's, not JSON's: an engine may choke on them.
        body = decoder.decode(text)
    except UnicodeDecodeError:
        raise GatewayError(400, "the request body is not UTF-8 encoded JSON") from None
    except RecursionError:
        raise GatewayError(
            400, f"the request body nests arrays or objects deeper than {MAX_DEPTH} levels"
        ) from None
    except ValueError as exc:
        # JSONDecodeError, a refused constant, or an integer too long for Python to convert.
        why = str(exc)
        if "integer string conversion" in why:
            why = "an integer has more digits than any model takes"
        raise GatewayError(400, f"the request body is not valid JSON: {why}") from None
    # Counting brackets runs at C speed; only a body with many is walked.
    if brackets > MAX_DEPTH and _depth_over(body, MAX_DEPTH):
        raise GatewayError(
            400, f"the request body nests arrays or objects deeper than {MAX_DEPTH} levels"
        )
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
    # vLLM and SGLang started with priority scheduling serve a request's 'priority'
    # first: on a replica that teams share, a client's own would go ahead of theirs.
    if body.get("priority") not in (None, 0):
        raise GatewayError(
            400,
            "'priority' is not taken from a request: the fleet decides whose requests go first",
            param="priority",
        )
    model = body.get("model")
    if not model:
        raise GatewayError(400, "'model' is required: name the model to use", param="model")
    name, expected = _REQUIRED.get(endpoint) or _score_sides(body)
    value = body.get(name)
    if value is None:
        raise GatewayError(400, f"'{name}' is required for /v1/{endpoint}", param=name)
    if not _type_ok(value, expected):
        raise GatewayError(
            400, f"'{name}' must be {_TYPE_NAMES[expected]}, not {_json_type(value)}", param=name
        )
    if endpoint == "rerank" and not isinstance(body.get("documents"), str | list):
        raise GatewayError(
            400, "'documents' is required for /v1/rerank: a string or an array", param="documents"
        )
    if endpoint == "score":
        seconds = [b for a, b in _SCORE_SIDES if a == name]
        other = next((b for b in seconds if b in body), seconds[0])
        if not isinstance(body.get(other), str | list | dict):
            raise GatewayError(
                400, f"'{other}' is required for /v1/score beside '{name}'", param=other
            )
    if endpoint in ("chat/completions", "messages") and not value:
        raise GatewayError(400, "'messages' must not be empty", param="messages")
    if endpoint == "chat/completions":
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
    req = ParsedRequest(endpoint, body, raw, model, bool(body.get("stream")))
    api = apis.module(endpoint)
    if api is not None:
        api.check(body)
        try:
            req.chat = api.to_chat(body)
        except GatewayError as exc:
            req.chat_error = exc
    return req
