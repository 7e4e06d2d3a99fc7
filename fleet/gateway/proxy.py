"""Sending a request to a replica and its answer back to the client.

Retries: a failed connect, a connection dropped before any answer, or a
502/503 status goes to another replica, at most ``max_retries`` more times,
because nothing has reached the client yet. Once the first byte is on its way
to the client there is no going back: an upstream that then fails ends the
stream with an error event the client can read.
"""

import asyncio
import json
import logging
import random
import time

from . import apis, metrics, prefix, table, validate
from .errors import GatewayError, anthropic_error, error_body, sse_error_event
from .state import canary_tally
from .upstream import ConnectFailed, Disconnected, NoAnswer, Refused, UpstreamError

logger = logging.getLogger(__name__)

_SSE_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")
_MAX_LINE = 1 << 20
_USAGE = b'"usage"'
_TEXT_KEYS = (b'"content":', b'"text":')
_NO_TEXT = (b'"content":""', b'"content": ""', b'"text":""', b'"text": ""')


def carries_text(event: bytes) -> bool:
    """Whether a streamed event carries generated text: a token, for engines without usage.

    The first event (the role) and the last (the finish reason) carry none.
    """
    return any(k in event for k in _TEXT_KEYS) and not any(e in event for e in _NO_TEXT)


# Answers are the engine's JSON, which may hold -Infinity (a logprob) and the like:
# no refused constants here, unlike a client's body.
_ANSWER_DECODER = json.JSONDecoder()
# The body thread's, calling Python per integer and object (validate.read says why).
_YIELDING_ANSWER_DECODER = json.JSONDecoder(
    parse_int=validate.yielding_int, object_pairs_hook=validate.yielding_object
)


def usage_of(body: bytes, decoder: json.JSONDecoder = _ANSWER_DECODER) -> dict | None:
    """The ``usage`` object of an OpenAI-style answer (a whole one, or one streamed
    event's JSON): the top-level key of the object the answer is, read from its
    structure. Never found by searching its text: vLLM writes the client's own
    prompt (``prompt_logprobs``) after the real usage. Any thread."""
    if _USAGE not in body:
        return None  # the common case without usage, at the cost of a search
    try:
        answer = decoder.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    usage = answer.get("usage") if answer.__class__ is dict else None
    return usage if usage.__class__ is dict else None


async def answer_usage(body: bytes) -> dict | None:
    """``usage_of`` a whole answer: on the loop where it is small, else on the body thread."""
    if validate.on_loop(body):
        return usage_of(body)
    return await validate.off_loop(usage_of, body, _YIELDING_ANSWER_DECODER)


_INCLUDE = {"include_usage": True}
_STREAMED = ("chat/completions", "completions")


def wants_usage_added(req) -> bool:
    """A streamed request whose client did not ask for usage: the gateway asks for it."""
    body = req.body
    if req.endpoint not in _STREAMED or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    return not (isinstance(options, dict) and options.get("include_usage") is True)


def _event(text: bytes, decoder: json.JSONDecoder = _ANSWER_DECODER) -> dict | None:
    """A ``data:`` line's event object; None for one that is not a JSON object."""
    try:
        event = decoder.decode(text[5:].decode("utf-8", "surrogatepass"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return event if event.__class__ is dict else None


def _usage_in(event: dict | None) -> dict | None:
    usage = event.get("usage") if event is not None else None
    return usage if usage.__class__ is dict else None


def _message_usage(event: dict | None) -> dict | None:
    """Anthropic's stream: ``message_start`` carries it in its message, ``message_delta``
    at the top (cumulative: it overrides what came before)."""
    usage = _usage_in(event)
    if usage is None and event is not None:
        message = event.get("message")
        usage = _usage_in(message) if message.__class__ is dict else None
    return usage


def _response_usage(event: dict | None) -> dict | None:
    """The Responses API's stream: in the response that ``response.completed`` (or
    ``.incomplete``, ``.failed``) carries."""
    response = event.get("response") if event is not None else None
    return _usage_in(response) if response.__class__ is dict else None


# The usage in an engine's own events, by the API it speaks (None: chat and completions).
_USAGE_IN = {None: _usage_in, "messages": _message_usage, "responses": _response_usage}
# The events that end an engine's own stream of these APIs (they send no [DONE]).
_ENDS = {
    None: (),
    "messages": (b"message_stop", b"error"),
    "responses": (b"response.completed", b"response.incomplete", b"response.failed", b"error"),
}


class SSECheck:
    """Lets through only whole, well-formed event-stream lines and notices the final [DONE].

    Holding back a partial line means the client never sees half an event,
    so an error event can always follow cleanly.
    """

    __slots__ = (
        "tail",
        "done",
        "events",
        "usage",
        "strip_usage",
        "_dropped",
        "later",
        "usage_in",
        "ends",
        "named",
        "merge",
    )

    def __init__(self, strip_usage: bool = False, api: str | None = None):
        self.tail = b""
        self.done = False
        self.events = 0  # events carrying text: one token each, for engines that send
        self.usage = None  # no usage (the last event's, where they send it)
        # Events that name usage, in order, for ``settle``: a line too large to
        # parse on the loop, or a usage (a dict) read after one.
        self.later: list = []
        # Take out the usage-only event (``"choices": []``) the gateway asked for.
        self.strip_usage = strip_usage
        self._dropped = False
        # An engine's own stream of the Messages or Responses API (``api``): its usage
        # where that API puts it, its end at its last event, its events counted.
        self.usage_in = _USAGE_IN[api]
        self.ends = _ENDS[api]
        self.named = 0
        self.merge = api == "messages"

    def take(self, usage: dict) -> None:
        """A usage read from an event: the latest, or added to (Anthropic's comes in two)."""
        self.usage = {**self.usage, **usage} if self.merge and self.usage else usage

    def feed(self, chunk: bytes) -> tuple[bytes, str | None]:
        data = self.tail + chunk if self.tail else chunk
        cut = data.rfind(b"\n") + 1
        complete, self.tail = data[:cut], data[cut:]
        good = 0
        kept = None  # the lines let through, where an event was taken out
        for line in complete.split(b"\n")[:-1]:
            text = line.rstrip(b"\r")
            if text and not text.startswith(_SSE_FIELDS):
                return (
                    complete[:good] if kept is None else b"".join(kept),
                    f"a line that is not server-sent events: {text[:60]!r}",
                )
            drop = False
            if text in (b"data: [DONE]", b"data:[DONE]"):
                self.done = True
            elif text.startswith(b"data:"):
                if _USAGE in text:
                    # The event's own top-level "usage", from its JSON: text that only
                    # mentions usage (an echoed prompt, a token) is not a report.
                    if len(text) > validate.ON_LOOP_MAX_BYTES:
                        self.later.append(text)
                    else:
                        event = _event(text)
                        usage = self.usage_in(event)
                        if usage is not None:
                            if self.later:
                                self.later.append(usage)
                            else:
                                self.take(usage)
                            # The usage-only last event (no choices) the gateway asked for.
                            drop = self.strip_usage and event.get("choices") == []
                if carries_text(text):
                    self.events += 1
            elif text.startswith(b"event:"):
                self.named += 1
                if text[6:].strip() in self.ends:
                    self.done = True
            elif not text and self._dropped:
                drop = True  # the blank line that ended the event taken out
            self._dropped = drop and bool(text)
            if drop and kept is None:
                kept = [complete[:good]]
            elif not drop and kept is not None:
                kept.append(line + b"\n")
            good += len(line) + 1
        if kept is not None:
            complete = b"".join(kept)
        if len(self.tail) > _MAX_LINE:
            return complete, f"an event line longer than {_MAX_LINE} bytes"
        return complete, None


async def settle(check: SSECheck) -> None:
    """Read the usage of the events ``feed`` left for later, on the body thread."""
    for item in check.later:
        if item.__class__ is not dict:
            item = check.usage_in(await validate.off_loop(_event, item, _YIELDING_ANSWER_DECODER))
        if item is not None:
            check.take(item)
    check.later.clear()


class Reply:
    """What has been sent to the client so far."""

    __slots__ = (
        "send",
        "started",
        "status",
        "extra",
        "sse_open",
        "served_by",
        "woke",
        "framing",
    )

    def __init__(self, send):
        self.send = send
        self.started = False
        self.status = 0
        self.extra = None  # headers every answer carries (the key's x-ratelimit-*)
        # A streamed request that waited for a replica got its 200 and SSE
        # comments already (fleet.gateway.waiting): the answer continues that stream.
        self.sse_open = False
        self.served_by: tuple[str, str] | None = None  # (model, profile) of the last try
        # It waited for its model to wake: the answer names the replica (x-llmgw-woke).
        self.woke = False
        # /v1/messages and /v1/responses: how the answer and its errors are written in
        # the request's API (fleet.gateway.apis); None for the OpenAI endpoints.
        self.framing: apis.Framing | None = None

    async def start(self, status: int, headers: list) -> None:
        if self.sse_open:
            return
        self.started = True
        self.status = status
        if self.extra:
            headers = headers + self.extra
        await self.send({"type": "http.response.start", "status": status, "headers": headers})


def ring_key(gw, route: table.Route, req) -> int | None:
    """Where the prompt's prefix sits on the route's ring; None: the route has none."""
    if route.ring is None:
        return None
    if req.endpoint in _STREAMED:
        return prefix.key_of(req.endpoint, req.body, gw.limits.prefix_chars)
    if req.chat is not None:  # /v1/messages, /v1/responses: the prompt as chat sees it
        return prefix.key_of("chat/completions", req.chat, gw.limits.prefix_chars)
    return None


def canary_side(route: table.Route, at: int | None) -> bool:
    """Whether a request goes to the model's canary: ``canary_percent`` of them, the same
    side for the same prompt prefix (``at``) where the model routes by prefix."""
    draw = at if at is not None else random.getrandbits(32)
    return draw % 100 < route.canary_percent


def choose(gw, route: table.Route, at: int | None, tried) -> tuple[table.Upstream | None, str]:
    """The replica for an attempt, the least busy or by the prompt's prefix (``at``), and
    how the prefix chose it ("": not by prefix), for ``prefix_routed``.

    With a canary, a first attempt goes to the canary's side or the active side by
    its share (the least busy there; a side with no replica left gives way to the
    other); a retry may go to either."""
    if route.canary_percent and not tried:
        side = canary_side(route, at)
        others = [u for u in route.upstreams if u.canary != side]
        up = table.pick(route, others)
        if up is not None:
            return up, ""
    if at is None:
        return table.pick(route, tried), ""
    return table.pick_prefix(route, at, gw.limits.prefix_policy, tried)


async def admit(gw, route: table.Route, up: table.Upstream, key, at) -> table.Upstream | None:
    """The replica a first attempt goes to once there is room: on it (under
    ``max_outstanding``) and for the key (under its ``max_concurrent``). Without room,
    the request waits its turn in fair order (fleet/gateway/fair.py), or is answered
    429 when the gateway holds no queue."""
    limits, again = gw.limits, False
    if key is not None and key.batch:
        return await batch_room(gw, route, up, key, at)
    while True:
        full = up.outstanding >= limits.max_outstanding
        key_full = key is not None and gw.fair.key_full(key)
        if not full and not key_full:
            return up
        if key is None or not gw.fair.size:
            check_capacity(route, up, limits)  # no queue: the 429 at once
            raise GatewayError(
                429,
                f"API key '{key.name}' has {key.max_concurrent} requests in flight, its most",
                code="too_many_in_flight",
                retry_after=1,
            )
        why = (
            f"{len(route.upstreams)} replica(s) with {limits.max_outstanding} requests in "
            "flight each"
            if full
            else f"API key '{key.name}' has {key.max_concurrent} requests in flight, its most"
        )
        await gw.fair.wait(route.name, key, why, again)
        again = True
        up, _ = choose(gw, route, at, [])
        if up is None:
            return None


# A batch's line waiting for room looks again at least this often: an engine's queue
# (its /metrics) empties without a request of this process ending.
BATCH_LOOK_S = 0.25


async def batch_room(gw, route: table.Route, up: table.Upstream, key, at) -> table.Upstream:
    """The replica a batch's line goes to, once one has room for it (``batch_refusal``).

    It waits in this process behind every interactive request, looking again each
    time a request of its model ends (``FairShare.ended``), for at most
    ``LLMGW_GATEWAY_FAIR_WAIT_S``; then the 429 that sends it back to its worker,
    which sends it again later. Waiting here rather than bouncing starts the line
    the moment there is room, without a worker's round trip per refusal."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + gw.fair.timeout_s
    while True:
        why = batch_refusal(gw, route, up)
        if not why and gw.fair.key_full(key):
            why = f"API key '{key.name}' has {key.max_concurrent} requests in flight"
        if not why:
            return up
        left = deadline - loop.time()
        if left <= 0:
            raise GatewayError(
                429,
                f"model '{route.name}' is busy ({why}): a batch line waits for room",
                code="model_at_capacity",
                retry_after=1,
            )
        room = gw.fair.batch_room.setdefault(route.name, asyncio.Event())
        try:
            await asyncio.wait_for(room.wait(), min(left, BATCH_LOOK_S))
        except TimeoutError:
            pass
        up, _ = choose(gw, route, at, [])
        if up is None:
            raise GatewayError(
                503, route.unavailable or f"model '{route.name}' has no ready replica",
                code="no_ready_replica", retry_after=route.retry_after,
            )  # fmt: skip


def batch_refusal(gw, route: table.Route, up: table.Upstream) -> str:
    """Why a batch's line may not start on ``up`` now ("" when it may). Batch lines take
    only what interactive requests leave: never a turn in the fair queue, none while an
    interactive request of the model waits there, none on a replica at its bound or
    whose engine already queues requests of its own (``engine_waiting``). An engine
    whose queue cannot be seen (no /metrics: llama-cpp-python's server, which answers
    one request at a time) gets one line at a time, so an interactive request that
    arrives waits behind one line at most, not a batch's worth."""
    queue = gw.fair.queues.get(route.name)
    if queue is not None and (queue.size or queue.handed):
        return f"{queue.size + queue.handed} interactive request(s) waiting"
    if up.outstanding >= gw.limits.max_outstanding:
        return f"its replicas have {gw.limits.max_outstanding} requests in flight each"
    if up.engine_waiting:
        return f"its engine queues {up.engine_waiting:g} request(s)"
    if up.engine_waiting is None and up.batch_outstanding:
        return "its engine's queue cannot be seen, and it has a batch line already"
    return ""


def check_capacity(route: table.Route, up: table.Upstream, limits) -> None:
    """The 429 when even the least busy replica has ``max_outstanding`` requests in flight."""
    if up.outstanding >= limits.max_outstanding:
        raise GatewayError(
            429,
            f"model '{route.name}' is at capacity: {len(route.upstreams)} "
            f"replica(s) with {limits.max_outstanding} requests in flight each",
            code="model_at_capacity",
            retry_after=1,
        )


def _changed(
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


def _encode_yielding(body: dict) -> bytes:
    return "".join(_YIELDING_ENCODER.iterencode(body)).encode()


async def upstream_body(route: table.Route, req, up: table.Upstream, translate: bool = False):
    """The body the engine gets, and whether the gateway asked it for usage on its own;
    written on the body thread where the body is large."""
    changed, strip_usage = _changed(route, req, up, translate)
    if changed is None:
        return req.raw, strip_usage
    if validate.on_loop(req.raw):
        return json.dumps(changed, allow_nan=False).encode(), strip_usage
    return await validate.off_loop(_encode_yielding, changed), strip_usage


def refused(route: table.Route, up: table.Upstream, exc: Refused) -> GatewayError:
    """An answer that broke a bound or is not HTTP the gateway speaks: 502."""
    metrics.upstream_error(route.name, up.replica_id, "protocol")
    return GatewayError(
        502, f"replica {up.replica_id} of model '{route.name}': {exc}", code=exc.code
    )


def no_answer(gw, route: table.Route, up: table.Upstream) -> GatewayError:
    """No status line within the first-byte timeout: the replica set aside, 504."""
    limits = gw.limits
    metrics.upstream_error(route.name, up.replica_id, "timeout")
    # An engine that accepts and then says nothing (its process frozen,
    # its node cut off) would hold every request sent to it as long.
    _set_aside(gw, route, up, f"no answer within {limits.first_byte_timeout_s:g} s")
    return GatewayError(
        504,
        f"replica {up.replica_id} of model '{route.name}' sent no answer within "
        f"{limits.first_byte_timeout_s:g} s",
        code="upstream_timeout",
    )


def too_slow(gw, route: table.Route) -> GatewayError:
    """The whole exchange over ``total_timeout_s`` before the answer started: 504."""
    return GatewayError(
        504,
        f"model '{route.name}' gave no complete answer within {gw.limits.total_timeout_s:g} s",
        code="upstream_timeout",
    )


def broken_whole(route: table.Route, up: table.Upstream, exc: UpstreamError) -> GatewayError:
    """A whole answer that could not be read to its end: 502."""
    if isinstance(exc, Refused):
        return refused(route, up, exc)
    metrics.upstream_error(route.name, up.replica_id, "protocol")
    return GatewayError(
        502,
        f"replica {up.replica_id} of model '{route.name}' closed the connection "
        "before its answer was complete",
        code="upstream_incomplete",
    )


def whole_answer(
    route: table.Route, up: table.Upstream, resp, body: bytes, api: str | None = None
) -> tuple[int, bytes]:
    """The status and body a whole answer goes back to the client with.

    A 2xx/3xx JSON answer that is not a JSON object is a 502 (raised); an
    error the engine worded its own way is put in OpenAI's shape, or on
    /v1/messages (``api``) in Anthropic's.
    """
    status = resp.status
    if status < 400:
        # A look at the ends, not a parse: enough to catch an HTML error page or a
        # cut-off body, and it costs nothing on the path every answer takes.
        text = body.strip()
        if resp.content_type == "application/json" and not (
            text.startswith(b"{") and text.endswith(b"}")
        ):
            metrics.upstream_error(route.name, up.replica_id, "protocol")
            raise GatewayError(
                502,
                f"replica {up.replica_id} of model '{route.name}' answered with "
                f"something that is not a JSON object: {body[:60]!r}",
                code="upstream_malformed",
            )
        return status, body
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # nested past Python's stack: not OpenAI's shape
        parsed = None
    if api == "messages":
        return status, _anthropic_error_body(route, up, status, resp, body, parsed)
    if not (isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)):
        # Engines word their errors their own way; clients expect OpenAI's shape.
        text = body[:300].decode("utf-8", "replace").strip() or resp.reason.strip()
        body = error_body(
            status, f"replica {up.replica_id} of model '{route.name}' answered {status}: {text}"
        )
    return status, body


def _anthropic_error_body(route, up, status: int, resp, body: bytes, parsed) -> bytes:
    """An engine's error on /v1/messages in Anthropic's shape: vLLM's already is; the
    message of one in OpenAI's shape (a chat completion's, translated); else its text."""
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and parsed.get("type") == "error":
        return body
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        text = body[:300].decode("utf-8", "replace").strip() or resp.reason.strip()
        message = f"replica {up.replica_id} of model '{route.name}' answered {status}: {text}"
    return json.dumps(anthropic_error(status, message)).encode()


def error_message(body: bytes) -> str:
    """The message of an error answer in either shape (``error.message``), else its text."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError, RecursionError):
        message = None
    return message if isinstance(message, str) else body[:300].decode("utf-8", "replace")


def stream_error(reply, message: str, code: str, status: int = 502) -> bytes:
    """The last events of a stream that failed: in the request's API (``Framing.fail``),
    or OpenAI's error event and ``[DONE]``."""
    if reply.framing is not None:
        return reply.framing.fail(message, code, status)
    return sse_error_event(message, code) + b"data: [DONE]\n\n"


def whole_headers(
    up: table.Upstream, resp, body: bytes, woke: bool = False
) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", (resp.header(b"content-type") or "application/json").encode()),
        (b"content-length", str(len(body)).encode()),
        *_replica_headers(up, woke),
    ]


class _Retry(Exception):
    def __init__(self, why: str):
        self.why = why


def _replica_headers(up: table.Upstream, woke: bool = False) -> list[tuple[bytes, bytes]]:
    """x-llmgw-replica, and x-llmgw-woke when the request waited for its model to wake."""
    replica = up.replica_id.encode()
    return [(b"x-llmgw-replica", replica)] + ([(b"x-llmgw-woke", replica)] if woke else [])


async def forward(gw, route: table.Route, req, reply: Reply, t0: float, key=None) -> None:
    """Serve ``req`` from a replica of ``route``. Raises GatewayError before the reply starts."""
    limits = gw.limits
    tried: list[table.Upstream] = []
    last = ""
    counted = None  # the key, once its request holds a slot (fair share)
    batch_on = None  # the replica a batch's line was admitted to
    # Hashed once, whatever the retries: where the prompt's prefix sits on the ring.
    at = ring_key(gw, route, req)
    try:
        async with asyncio.timeout(limits.total_timeout_s):
            for attempt in range(len(tried), limits.max_retries + 1):
                up, how = choose(gw, route, at, tried)
                if not attempt and how:
                    route.metrics.prefix_routed(how)
                if up is None:
                    break
                if attempt:
                    check_capacity(route, up, limits)
                else:
                    up = await admit(gw, route, up, key, at)
                    if up is None:
                        break
                    if key is not None:
                        gw.fair.started(key)
                        counted = key
                        if key.batch:
                            batch_on = up
                            up.batch_outstanding += 1
                if attempt:
                    route.metrics.retries.inc()
                try:
                    may_retry = (
                        attempt < limits.max_retries and len(route.upstreams) > len(tried) + 1
                    )
                    await _attempt(gw, route, up, req, reply, t0, may_retry, key)
                    return
                except _Retry as r:
                    tried.append(up)
                    last = r.why
                    log_retry(route, up, attempt + 1, r.why)
    except TimeoutError:
        if reply.started:
            await _end_stream_with_error(
                reply,
                f"model '{route.name}' gave no complete answer within {limits.total_timeout_s:g} s",
                "upstream_timeout",
                504,
            )
            return
        raise too_slow(gw, route) from None
    finally:
        gw.fair.ended(route.name, counted)
        if batch_on is not None:
            batch_on.batch_outstanding -= 1
    if tried:
        raise GatewayError(
            502,
            f"model '{route.name}': {len(tried)} attempt(s) failed, the last: {last}",
            code="upstream_unavailable",
        )
    cooling = sum(1 for u in route.upstreams if u.cooldown_until > time.monotonic())
    raise GatewayError(
        503,
        f"model '{route.name}' has no reachable replica: {cooling} set aside for "
        f"{limits.cooldown_s:g} s after failed connects or a timeout",
        code="no_ready_replica",
        retry_after=max(1, int(limits.cooldown_s)),
    )


async def _attempt(
    gw, route, up: table.Upstream, req, reply: Reply, t0: float, may_retry: bool, key=None
) -> None:
    limits = gw.limits

    if req.endpoint in apis.PASSED_ONLY and not apis.native(up.engine, req.endpoint):
        raise apis.unsupported(route.name, up.replica_id, up.engine, req.endpoint)
    # /v1/messages and /v1/responses: passed through to an engine that serves the API,
    # translated to a chat completion for any other (fleet.gateway.apis).
    framing = reply.framing
    translate = framing is not None and not apis.native(up.engine, req.endpoint)
    if translate and req.chat is None:
        raise req.chat_error
    if framing is not None:
        framing.translating = translate
    endpoint = "chat/completions" if translate else req.endpoint
    native_api = req.endpoint if framing is not None and not translate else None
    body, strip_usage = await upstream_body(route, req, up, translate)
    reply.served_by = (up.model, up.profile)
    up.outstanding += 1
    try:
        try:
            host, port = up.address
            resp = await gw.client.post(
                host, port, up.request_head(endpoint), body, limits.first_byte_timeout_s
            )
        except ConnectFailed as exc:
            raise _Retry(not_connected(gw, route, up, exc)) from None
        except Disconnected as exc:
            # A pooled connection to an engine that restarted or died, before any
            # answer: nothing reached the client, so another replica may take it.
            raise _Retry(dropped(route, up, exc)) from None
        except Refused as exc:
            raise refused(route, up, exc) from None
        except NoAnswer:
            raise no_answer(gw, route, up) from None
        up.connect_failures = 0
        try:
            if resp.status in (502, 503) and may_retry:
                raise _Retry(unavailable(route, up, resp.status))
            if resp.status >= 500 and (
                route.fallbacks if key is None else key.fallbacks_for(route)
            ):
                # The last try failed too: the model's fallback answers instead
                # (fleet.gateway.app), not this error.
                raise _Retry(unavailable(route, up, resp.status))
            if resp.content_type == "text/event-stream" and resp.status == 200:
                await _stream(gw, route, up, resp, reply, t0, key, strip_usage, native_api)
            else:
                await _whole(gw, route, up, resp, reply, key)
        except BaseException:
            # Closed, not returned to the pool: on a client that went away this
            # is what tells the engine to stop generating.
            resp.close()
            raise
        resp.release()
    finally:
        up.outstanding -= 1


# How an attempt failed before anything reached the client, counted; each says
# why another replica is tried.


def not_connected(gw, route, up: table.Upstream, exc: ConnectFailed) -> str:
    metrics.upstream_error(route.name, up.replica_id, "connect")
    up.connect_failures += 1
    if up.connect_failures >= gw.limits.cooldown_after:
        _set_aside(gw, route, up, f"{up.connect_failures} failed connects in a row")
    return f"could not connect to replica {up.replica_id} at {up.url}: {exc}"


def dropped(route, up: table.Upstream, exc: Disconnected) -> str:
    metrics.upstream_error(route.name, up.replica_id, "disconnect")
    return f"replica {up.replica_id} dropped the connection: {exc}"


def unavailable(route, up: table.Upstream, status: int) -> str:
    metrics.upstream_error(route.name, up.replica_id, "status")
    return f"replica {up.replica_id} answered {status}"


def log_retry(route, up: table.Upstream, attempt: int, why: str) -> None:
    logger.warning(
        "upstream failed before answering model=%s replica=%s attempt=%d: %s",
        route.name,
        up.replica_id,
        attempt,
        why,
    )


def _set_aside(gw, route, up: table.Upstream, why: str) -> None:
    """No new request goes to ``up`` for GATEWAY_COOLDOWN_S (a 503 if no other replica is left)."""
    up.cooldown_until = time.monotonic() + gw.limits.cooldown_s
    up.connect_failures = 0
    metrics.COOLDOWNS.labels(route.name, up.replica_id).inc()
    logger.warning(
        "replica set aside model=%s replica=%s url=%s for_s=%g: %s",
        route.name,
        up.replica_id,
        up.url,
        gw.limits.cooldown_s,
        why,
    )


async def _whole(gw, route, up, resp, reply: Reply, key) -> None:
    try:
        body = await resp.read()
    except UpstreamError as exc:
        raise broken_whole(route, up, exc) from None
    framing = reply.framing
    status, body = whole_answer(route, up, resp, body, framing.api if framing else None)
    usage = chat = None
    if status < 400 and framing is not None and framing.translating:
        chat = await _answer_object(route, up, body)
        usage = _usage_in(chat)
        if not reply.sse_open:
            body = await _encode(framing.answer(chat), body)
    elif status < 400:
        usage = await answer_usage(body)
    if reply.sse_open:
        await _whole_as_events(gw, route, key, reply, status, body, usage, chat)
        return
    await reply.start(status, whole_headers(up, resp, body, reply.woke))
    charge = tally(gw, route, key, usage) if status < 400 else None
    await reply.send({"type": "http.response.body", "body": body})
    await _charge(gw, key, charge)


async def _whole_as_events(
    gw, route, key, reply: Reply, status: int, body: bytes, usage: dict | None, chat=None
) -> None:
    """A whole answer on a stream already open (the request waited): as events, then
    [DONE]; in the request's API where it has one (a translated answer as its events)."""
    framing = reply.framing
    if status < 400 and framing is None:
        out = b"data: " + b" ".join(body.split(b"\n")) + b"\n\ndata: [DONE]\n\n"
    elif status < 400 and chat is not None:
        out = framing.whole(chat)
    elif status < 400:
        # An engine's own answer to these APIs, whole where a stream was asked for.
        out = stream_error(reply, "the engine answered a streamed request whole", "upstream_error")
    else:
        out = stream_error(reply, error_message(body), "upstream_error", status)
    charge = tally(gw, route, key, usage) if status < 400 else None
    await reply.send({"type": "http.response.body", "body": out})
    await _charge(gw, key, charge)


async def _answer_object(route, up, body: bytes) -> dict:
    """A whole chat answer to translate, parsed (on the body thread where it is large)."""
    if validate.on_loop(body):
        answer = _decode_object(body, _ANSWER_DECODER)
    else:
        answer = await validate.off_loop(_decode_object, body, _YIELDING_ANSWER_DECODER)
    if answer is None:
        metrics.upstream_error(route.name, up.replica_id, "protocol")
        raise GatewayError(
            502,
            f"replica {up.replica_id} of model '{route.name}' answered with something that is "
            f"not a JSON object: {body[:60]!r}",
            code="upstream_malformed",
        )
    return answer


def _decode_object(body: bytes, decoder: json.JSONDecoder) -> dict | None:
    try:
        answer = decoder.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return answer if answer.__class__ is dict else None


async def _encode(answer: dict, like: bytes) -> bytes:
    """A translated answer written out: on the body thread where its source was large."""
    if validate.on_loop(like):
        return json.dumps(answer).encode()
    return await validate.off_loop(_encode_yielding, answer)


async def _translated(framing, data: bytes) -> bytes:
    """Whole lines of an engine's chat stream in, the request's API's events out."""
    out = []
    for line in data.split(b"\n"):
        text = line.rstrip(b"\r")
        if not text.startswith(b"data:") or framing.ended:
            continue
        if text in (b"data: [DONE]", b"data:[DONE]"):
            out.append(framing.finish())
            continue
        if len(text) > validate.ON_LOOP_MAX_BYTES:
            event = await validate.off_loop(_event, text, _YIELDING_ANSWER_DECODER)
        else:
            event = _event(text)
        if event is not None:
            out.append(framing.chunk(event))
    return b"".join(out)


def tally(gw, route, key, usage, events: int = 0) -> tuple[int, float] | None:
    """An answer's tokens into the metrics and the key's usage, before its last byte
    goes: a client that reads /metrics the moment it has its answer finds it counted.
    What to charge against the key's limits afterwards (``_charge``: Redis, maybe a wait)."""
    prompt, completion = route.metrics.tokens(usage, events)
    if key is None:
        return None
    return prompt + completion, gw.tally(key, route.name, prompt, completion)


async def _charge(gw, key, charge: tuple[int, float] | None) -> None:
    if charge is not None:
        await gw.charge(key, *charge)


_BACKGROUND: set[asyncio.Task] = set()  # referenced until done, so none is collected


def _in_background(coro) -> None:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def _stream(
    gw, route, up, resp, reply: Reply, t0: float, key, strip_usage: bool, api: str | None = None
) -> None:
    """Stream an answer back as it comes: the engine's own events (``api``, where it
    speaks the request's Messages or Responses API itself), or translated into them
    from its chat stream (``reply.framing.translating``)."""
    await reply.start(
        200,
        [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            *_replica_headers(up, reply.woke),
        ],
    )
    send = reply.send
    check = SSECheck(strip_usage, api)
    framing = reply.framing
    conv = framing if framing is not None and framing.translating else None
    first = True
    problem = None
    try:
        async for chunk in resp.iter_chunks():
            if first:
                took = time.perf_counter() - t0
                route.metrics.ttft.observe(took)
                metrics.PROFILE_TTFT.labels(up.model, up.profile).observe(took)
                if route.canary_percent and up.model == route.name:
                    canary_tally(gw, route, up.profile).first_token(took)
                first = False
            good, problem = check.feed(chunk)
            if check.later:
                await settle(check)
            if conv is not None:
                good = await _translated(conv, good) if good else good
            elif framing is not None:
                framing.passed = check.named
            if good:
                await send({"type": "http.response.body", "body": good, "more_body": True})
            if problem:
                problem = f"replica {up.replica_id} of model '{route.name}' sent {problem}"
                break
    except Refused as exc:
        problem = f"replica {up.replica_id} of model '{route.name}': {exc}"
    except UpstreamError:
        pass
    except BaseException:
        # The client went away (its request cancelled) or could not be written to:
        # what it was sent is charged all the same, from the usage if one came,
        # else one token per event with text. Not waited for: the task is ending.
        _in_background(_charge(gw, key, tally(gw, route, key, *_counted(check, conv))))
        raise
    if problem is None and (check.tail or not check.done):
        problem = (
            f"replica {up.replica_id} of model '{route.name}' closed the stream before it finished"
        )
    if problem:
        metrics.upstream_error(route.name, up.replica_id, "protocol")
        logger.warning(
            "stream ended badly model=%s replica=%s: %s", route.name, up.replica_id, problem
        )
        resp.close()
        charge = tally(gw, route, key, *_counted(check, conv))
        await _end_stream_with_error(reply, problem, "upstream_stream_error")
        await _charge(gw, key, charge)
        return
    charge = tally(gw, route, key, *_counted(check, conv))
    await send({"type": "http.response.body", "body": b""})
    await _charge(gw, key, charge)


def _counted(check: SSECheck, conv) -> tuple[dict | None, int]:
    """(usage, pieces) of a stream to count: what a translated stream told its client."""
    if conv is not None:
        return conv.usage, conv.pieces
    return check.usage, check.events


async def _end_stream_with_error(reply: Reply, message: str, code: str, status: int = 502) -> None:
    await reply.send(
        {"type": "http.response.body", "body": stream_error(reply, message, code, status)}
    )
