"""Sending a request to a replica and its answer back to the client, its tokens counted.

``forward`` runs the attempts: the replica from ``choice``, admitted by ``fair``,
the body from ``outgoing``; the answer goes back whole or streamed as it comes,
translated where the request's API is not the engine's (``apis``), its usage read
by ``answers`` and counted (``tally``) before its last byte goes.

Retries: a failed connect, a connection dropped before any answer, or a
502/503 status goes to another replica, at most ``max_retries`` more times,
because nothing has reached the client yet (``failures.Retry``). Once the first
byte is on its way to the client there is no going back: an upstream that then
fails ends the stream with an error event the client can read.
"""

import asyncio
import json
import logging
import time

from . import apis, metrics, table, validate
from .answers import (
    ANSWER_DECODER,
    YIELDING_ANSWER_DECODER,
    SSECheck,
    answer_usage,
    decode_object,
    event_of,
    settle,
    usage_in,
)
from .choice import choose, ring_key
from .errors import GatewayError
from .failures import (
    Retry,
    broken_whole,
    dropped,
    error_message,
    log_retry,
    no_answer,
    not_connected,
    refused,
    stream_error,
    too_slow,
    unavailable,
    whole_answer,
)
from .fair import admit, check_capacity
from .http1 import ConnectFailed, Disconnected, NoAnswer, Refused, UpstreamError
from .outgoing import encode_yielding, upstream_body
from .state import canary_tally

logger = logging.getLogger(__name__)


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


def whole_headers(
    up: table.Upstream, resp, body: bytes, woke: bool = False
) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", (resp.header(b"content-type") or "application/json").encode()),
        (b"content-length", str(len(body)).encode()),
        *_replica_headers(up, woke),
    ]


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
                except Retry as r:
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
            raise Retry(not_connected(gw, route, up, exc)) from None
        except Disconnected as exc:
            # A pooled connection to an engine that restarted or died, before any
            # answer: nothing reached the client, so another replica may take it.
            raise Retry(dropped(route, up, exc)) from None
        except Refused as exc:
            raise refused(route, up, exc) from None
        except NoAnswer:
            raise no_answer(gw, route, up) from None
        up.connect_failures = 0
        try:
            if resp.status in (502, 503) and may_retry:
                raise Retry(unavailable(route, up, resp.status))
            if resp.status >= 500 and (
                route.fallbacks if key is None else key.fallbacks_for(route)
            ):
                # The last try failed too: the model's fallback answers instead
                # (fleet.gateway.app), not this error.
                raise Retry(unavailable(route, up, resp.status))
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
        usage = usage_in(chat)
        if not reply.sse_open:
            body = await _encode(framing.answer(chat), body)
    elif status < 400:
        usage = await answer_usage(body)
    if reply.sse_open:
        await _whole_as_events(gw, route, key, reply, status, body, usage, chat)
        return
    await reply.start(status, whole_headers(up, resp, body, reply.woke))
    await _charge(gw, key, tally(gw, route, key, usage) if status < 400 else None)
    await reply.send({"type": "http.response.body", "body": body})


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
    await _charge(gw, key, tally(gw, route, key, usage) if status < 400 else None)
    await reply.send({"type": "http.response.body", "body": out})


async def _answer_object(route, up, body: bytes) -> dict:
    """A whole chat answer to translate, parsed (on the body thread where it is large)."""
    if validate.on_loop(body):
        answer = decode_object(body, ANSWER_DECODER)
    else:
        answer = await validate.off_loop(decode_object, body, YIELDING_ANSWER_DECODER)
    if answer is None:
        metrics.upstream_error(route.name, up.replica_id, "protocol")
        raise GatewayError(
            502,
            f"replica {up.replica_id} of model '{route.name}' answered with something that is "
            f"not a JSON object: {body[:60]!r}",
            code="upstream_malformed",
        )
    return answer


async def _encode(answer: dict, like: bytes) -> bytes:
    """A translated answer written out: on the body thread where its source was large."""
    if validate.on_loop(like):
        return json.dumps(answer).encode()
    return await validate.off_loop(encode_yielding, answer)


async def translated(framing, data: bytes) -> bytes:
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
            event = await validate.off_loop(event_of, text, YIELDING_ANSWER_DECODER)
        else:
            event = event_of(text)
        if event is not None:
            out.append(framing.chunk(event))
    return b"".join(out)


def tally(gw, route, key, usage, events: int = 0) -> tuple[int, float] | None:
    """An answer's tokens into the metrics and the key's usage, before its last byte
    goes: a client that reads /metrics the moment it has its answer finds it counted.
    What to charge against the key's limits (``_charge``), before the last byte as well:
    a client that asks again the moment it has its answer is checked against it."""
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
                good = await translated(conv, good) if good else good
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
        await _charge(gw, key, tally(gw, route, key, *_counted(check, conv)))
        await _end_stream_with_error(reply, problem, "upstream_stream_error")
        return
    await _charge(gw, key, tally(gw, route, key, *_counted(check, conv)))
    await send({"type": "http.response.body", "body": b""})


def _counted(check: SSECheck, conv) -> tuple[dict | None, int]:
    """(usage, pieces) of a stream to count: what a translated stream told its client."""
    if conv is not None:
        return conv.usage, conv.pieces
    return check.usage, check.events


async def _end_stream_with_error(reply: Reply, message: str, code: str, status: int = 502) -> None:
    await reply.send(
        {"type": "http.response.body", "body": stream_error(reply, message, code, status)}
    )
