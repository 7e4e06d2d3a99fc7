"""The body an engine is sent for a request, where it is not the client's own.

The engine serves its profile's name, not the model's (or a fallback's) the
client asked for; an adapter's request carries what the engine needs to apply it
(``table.adapter_fields``), and a base model's on an engine holding adapters says
that none applies (``table.base_fields``); a stream whose client did not ask for
usage asks for it, and the event carrying it is taken out on the way back
(``answers.SSECheck``). A translated request sends its chat completion
(``req.chat``). A large body is written out on the body thread.
"""

import json

from . import table, validate
from .errors import GatewayError

_INCLUDE = {"include_usage": True}
_STREAMED = ("chat/completions", "completions")


def wants_usage_added(req) -> bool:
    """A streamed request whose client did not ask for usage: the gateway asks for it."""
    body = req.body
    if req.endpoint not in _STREAMED or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    return not (isinstance(options, dict) and options.get("include_usage") is True)


def changed_body(
    route: table.Route, req, up: table.Upstream, translate: bool = False
) -> tuple[dict | None, bool]:
    """The body to send where it is not the client's own (None where it is), and whether
    the gateway asked the engine for usage on its own. ``translate``: the request's
    chat completion (``req.chat``), for an engine that does not serve its API."""
    strip_usage = wants_usage_added(req)
    body = req.chat if translate else req.body
    if not translate and up.served_name == req.model and not strip_usage and up.base_fields is None:
        return None, strip_usage
    # The engine serves the profile's name; the client asked for the model's (or for
    # another model, whose fallback this is), or for an adapter the engine holds.
    if route.base:
        fields = up.adapters.get(route.name)
        if fields is None:  # unloaded since the request was routed: ask again
            raise GatewayError(
                503,
                f"adapter '{route.name}' was unloaded from replica {up.replica_id}; try again",
                code="no_ready_replica",
                retry_after=1,
            )
        changed = {**body, **fields}
    else:
        changed = {**body, "model": up.served_name, **(up.base_fields or {})}
    if strip_usage:
        # The engine reports usage in a last chunk only when asked; the client
        # did not ask, so that chunk is taken out again on the way back.
        changed["stream_options"] = {**(req.body.get("stream_options") or {}), **_INCLUDE}
    return changed, strip_usage


# Written out in Python, not C: slower, but the interpreter can switch to the loop.
_YIELDING_ENCODER = json.JSONEncoder(allow_nan=False)


def encode_yielding(body: dict) -> bytes:
    """``body`` as JSON, written so the body thread yields to the loop as it goes."""
    return "".join(_YIELDING_ENCODER.iterencode(body)).encode()


# What a stream whose client did not ask for usage gets added, where nothing else changes.
_ASK_USAGE = b',"stream_options":{"include_usage":true}'
_WHITESPACE = b" \t\r\n"


def usage_asked(route: table.Route, req, up: table.Upstream, translate: bool = False):
    """The client's own body with ``stream_options`` added before its closing brace, where
    that is the only change (``changed_body``) and the body is UTF-8 with no
    ``stream_options`` of its own; else None.

    The bytes are the client's as they came, parsed already (``validate``): a JSON
    object, so its last character but whitespace is its closing brace, and it has at
    least its "model" before it. Writing a 220 KB prompt out again costs the gateway
    more than the rest of the request (docs/benchmarks.md); this costs a copy.
    """
    raw = req.raw
    if (
        translate
        or route.base
        or up.served_name != req.model
        or up.base_fields is not None
        or "stream_options" in req.body
        or json.detect_encoding(raw) != "utf-8"
    ):
        return None
    end = len(raw) - 1
    while raw[end] in _WHITESPACE:  # JSON's, after the brace
        end -= 1
    view = memoryview(raw)  # one copy of a large body, not three
    return b"".join((view[:end], _ASK_USAGE, view[end:]))


async def upstream_body(route: table.Route, req, up: table.Upstream, translate: bool = False):
    """The body the engine gets, and whether the gateway asked it for usage on its own;
    written on the body thread where the body is large."""
    changed, strip_usage = changed_body(route, req, up, translate)
    if changed is None:
        return req.raw, strip_usage
    if strip_usage:
        asked = usage_asked(route, req, up, translate)
        if asked is not None:
            return asked, strip_usage
    if validate.on_loop(req.raw):
        return json.dumps(changed, allow_nan=False).encode(), strip_usage
    return await validate.off_loop(encode_yielding, changed), strip_usage
