"""The ASGI app for /v1/*: OpenAI's models, chat completions, completions, embeddings and
Responses, Anthropic's Messages (the last two through ``fleet.gateway.apis``), and the
rerank and score APIs of engines that serve them.

Mounted ahead of Django in ``llmgw_site.asgi`` (and alone in
``llmgw_site.gateway_asgi``): no middleware, no ORM on the request path. A
request is authenticated and routed from memory (``state.Gateway``), then
proxied (``proxy.forward``).
"""

import asyncio
import json
import logging
import time

from . import apis, failures, keys, metrics, proxy, validate, waiting
from .errors import GatewayError, internal
from .state import canary_tally, gateway

logger = logging.getLogger(__name__)

# How soon a request starts listening for its client going away (within twice
# this): an engine works at most that long for a client that left. Listening
# costs a task per request; most short answers are over before.
_WATCH_AFTER_S = 0.1

PROXIED = {
    "/v1/chat/completions": "chat/completions",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/v1/rerank": "rerank",
    "/v1/score": "score",
}


async def application(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    t0 = time.perf_counter()
    reply = proxy.Reply(send)
    route = None
    path = scope["path"]
    # Anthropic's error shape on /v1/messages, OpenAI's everywhere else.
    api = apis.api_of(path)
    try:
        gw = gateway()
        await gw.ensure_started()
        endpoint = PROXIED.get(path)
        if endpoint is not None:
            if scope["method"] != "POST":
                raise GatewayError(405, f"{path} takes POST, not {scope['method']}")
            key = await gw.key_for(scope["headers"])
            raw = await _read_body(scope, receive, gw.limits.max_body_bytes[endpoint])
            # A large body is parsed on the body thread, never on the loop.
            req = await validate.read(endpoint, raw)
            reply.framing = apis.framing(req)
            route = admit(gw, key, req, t0)
            keys.check_budget(key, time.time())  # a team's budget in money, spent
            if key.limits.on:
                # One Redis round trip; raises the 429 when the key is over a limit.
                reply.extra = await gw.limiter.check(key)
            await _serve_or_fall_back(gw, route, req, scope, receive, reply, t0, key)
        elif path == "/v1/models" or path.startswith("/v1/models/"):
            if scope["method"] not in ("GET", "HEAD"):
                raise GatewayError(405, f"{path} takes GET, not {scope['method']}")
            key = await gw.key_for(scope["headers"])
            model_id = path[len("/v1/models/") :] if path != "/v1/models" else None
            await _models(gw, key, model_id, reply, head=scope["method"] == "HEAD")
        else:
            raise GatewayError(
                404,
                f"unknown path {path}: the gateway serves /v1/models, /v1/chat/completions, "
                "/v1/completions, /v1/embeddings, /v1/responses, /v1/messages, /v1/rerank "
                "and /v1/score",
                code="unknown_url",
            )
    except GatewayError as exc:
        if reply.sse_open:
            # A streamed request that waited for a replica has its 200 already.
            await send(
                {
                    "type": "http.response.body",
                    "body": failures.stream_error(
                        reply, exc.message, exc.code or "error", exc.status
                    ),
                }
            )
            return
        if reply.started:
            # Only a bug gets here; the client has a status line already.
            logger.error("gateway error after the reply started: %s", exc.message)
            return
        headers, body = exc.answer(api)
        await reply.start(exc.status, headers)
        await send({"type": "http.response.body", "body": body})
    except _ClientGone:
        reply.status = 499  # nginx's word for it: nobody was left to answer
    except Exception:
        # A bug, not the client's doing: logged with its traceback here, and
        # answered in OpenAI's shape rather than as the server's HTML page.
        logger.exception("gateway failed on %s %s", scope.get("method"), scope.get("path"))
        if not reply.started:
            headers, body = internal().answer(api)
            await reply.start(500, headers)
            await send({"type": "http.response.body", "body": body})
    finally:
        if route is not None:
            route.metrics.count(reply.status)
            route.metrics.latency.observe(time.perf_counter() - t0)
            if reply.served_by is not None:
                metrics.PROFILE_REQUESTS.labels(*reply.served_by, str(reply.status)).inc()
                served, profile = reply.served_by
                if route.canary_percent and served == route.name:
                    canary_tally(gw, route, profile).answered(reply.status)
        else:
            metrics.count_unrouted(reply.status)


class _ClientGone(Exception):
    pass


def admit(gw, key, req, t0: float):
    """The route for a parsed request (``validate.read``); the GatewayError that says why not."""
    route = _route_for(gw, key, req.model)
    if key.batch:
        return route  # a batch's lines are no one's demand; in flight, they keep it busy
    gw.last_request[route.name] = t0
    if route.base:
        gw.last_request[route.base] = t0  # an adapter's request is its base model's too
    return route


def _route_for(gw, key, model: str):
    if not key.may_use(model):
        raise GatewayError(
            403,
            f"API key '{key.name}' may not use model '{model}'",
            param="model",
            code="model_not_allowed",
        )
    route = gw.routes.get(model)
    if route is None:
        raise GatewayError(
            404,
            f"model '{model}' does not exist",
            param="model",
            code="model_not_found",
        )
    if not key.may_call(route):
        raise GatewayError(
            403,
            f"model '{model}' is kept to the API keys of team '{route.kept_to[1]}', and key "
            f"'{key.name}' is {'of another team' if key.team_id else 'of no team'}",
            param="model",
            code="model_not_allowed",
        )
    if not route.upstreams and not route.waits and not key.fallbacks_for(route):
        raise GatewayError(
            503, route.unavailable, code="no_ready_replica", retry_after=route.retry_after
        )
    return route


async def _read_body(scope, receive, limit: int) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise GatewayError(400, "the Content-Length header is not a number") from None
            if declared > limit:
                raise GatewayError(
                    413,
                    f"the request body is {declared} bytes; the limit is {limit}",
                    code="request_too_large",
                )
    chunks = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _ClientGone()
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise GatewayError(
                413,
                f"the request body is over the limit of {limit} bytes",
                code="request_too_large",
            )
        chunks.append(chunk)
        if not msg.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Watch:
    """A request in flight, to be told when its client goes away."""

    __slots__ = ("receive", "task", "since", "gone", "done", "watcher")

    def __init__(self, receive, task, since: float):
        self.receive = receive
        self.task = task
        self.since = since
        self.gone = False
        self.done = False
        self.watcher: asyncio.Future | None = None

    def start(self) -> None:
        self.watcher = asyncio.ensure_future(self.receive())
        self.watcher.add_done_callback(self._on_message)

    def _on_message(self, fut: asyncio.Future) -> None:
        if fut.cancelled() or self.done:
            return
        if fut.exception() is None and fut.result().get("type") == "http.disconnect":
            self.gone = True
            self.task.cancel()


async def _sweep(gw) -> None:
    """Start listening for the client of every request older than ``_WATCH_AFTER_S``.

    One task per process that wakes every ``_WATCH_AFTER_S`` while requests are
    in flight, rather than a timer per request: a request that is over before
    it is looked at (most short answers) costs a dict entry, not a timer (3.6 µs
    under uvloop) and, under load, a task listening on its connection.
    """
    loop = asyncio.get_running_loop()
    watched = gw.watched
    try:
        while watched:
            await asyncio.sleep(_WATCH_AFTER_S)
            cutoff = loop.time() - _WATCH_AFTER_S
            # Oldest first (insertion order): stop at the first one too young.
            for w in list(watched):
                if w.since > cutoff:
                    break
                del watched[w]
                w.start()
    finally:
        gw.sweeper = None


# Why a model's own answer gives way to a fallback's: none of its replicas ready past
# its waiting bounds, or every try at them failed. A 4xx, or an answer begun, never.
FALLBACK_WHY = {
    "no_ready_replica": "no_ready_replica",
    "too_many_waiting": "no_ready_replica",
    "upstream_unavailable": "upstream_failed",
    "upstream_timeout": "upstream_failed",
    "upstream_incomplete": "upstream_failed",
}


async def _serve_or_fall_back(gw, route, req, scope, receive, reply, t0, key) -> None:
    """Serve from ``route``; past its bounds, from its fallbacks in order, then the key's
    (docs/gateway.md).

    A fallback is tried only before any of the answer reached the client (a stream
    before its first byte), only if the key may use it, and only while it has a
    ready replica: a fallback is never waited for.
    """
    try:
        await _serve(gw, route, req, scope, receive, reply, t0, key)
        return
    except GatewayError as exc:
        why = FALLBACK_WHY.get(exc.code or "")
        # A batch's line waits for its own model instead: it takes no fallback's room.
        chain = () if key.batch else key.fallbacks_for(route)
        if why is None or reply.started or not chain:
            raise
        first = exc
    for name in chain:
        other = gw.routes.get(name)
        if other is None or not other.upstreams or not key.may_call(other):
            continue
        metrics.FALLBACKS.labels(route.name, name, why).inc()
        logger.info("fallback model=%s fallback=%s why=%s", route.name, name, why)
        header = (b"x-llmgw-fallback", name.encode())
        reply.extra = [*(reply.extra or []), header]
        if reply.sse_open:  # a stream that waited has its 200 already: said in a comment
            await reply.send(
                {
                    "type": "http.response.body",
                    "body": f": fallback {name}\n\n".encode(),
                    "more_body": True,
                }
            )
        try:
            await _serve(gw, other, req, scope, receive, reply, t0, key)
            return
        except GatewayError as exc:
            if FALLBACK_WHY.get(exc.code or "") is None or reply.started:
                raise
            reply.extra.remove(header)
    raise first


async def _serve(gw, route, req, scope, receive, reply, t0, key=None) -> None:
    """Proxy, and cancel the upstream request if the client goes away meanwhile."""
    loop = asyncio.get_running_loop()
    w = _Watch(receive, asyncio.current_task(loop), loop.time())
    gw.watched[w] = None
    if gw.sweeper is None:
        gw.sweeper = loop.create_task(_sweep(gw))
    try:
        if not route.upstreams:
            if key is not None and key.batch:
                # A batch's line never wakes a model or asks for a replica: it is
                # sent again later (fleet.services.batches.runner).
                raise GatewayError(
                    503, route.unavailable, code="no_ready_replica", retry_after=route.retry_after
                )
            asleep, began = route.asleep, loop.time()
            route = await waiting.wait_for_replica(gw, route, req, reply)
            if asleep:
                waited = loop.time() - began
                reply.woke = True
                metrics.WOKEN.labels(route.name).inc()
                metrics.WAKE_WAIT.labels(route.name).observe(waited)
                if reply.sse_open:  # its 200 went out while it waited: said in a comment
                    await reply.send(
                        {
                            "type": "http.response.body",
                            "body": f": woke after {waited:.2f} s\n\n".encode(),
                            "more_body": True,
                        }
                    )
        await proxy.forward(gw, route, req, reply, t0, key)
    except asyncio.CancelledError:
        if not w.gone:
            raise
        w.task.uncancel()
        logger.info(
            "client went away; upstream request cancelled model=%s started=%s",
            route.name,
            reply.started,
        )
        raise _ClientGone() from None
    finally:
        w.done = True
        gw.watched.pop(w, None)
        if w.watcher is not None:
            w.watcher.cancel()


async def _models(gw, key, model_id: str | None, reply, head: bool = False) -> None:
    def obj(route):
        out = {"id": route.name, "object": "model", "created": route.created, "owned_by": "llmgw"}
        if route.base:  # an adapter names its base model, as vLLM's listing does
            out["parent"] = route.base
        return out

    if model_id is None:
        data = [obj(r) for _, r in sorted(gw.routes.items()) if key.may_call(r)]
        body = {"object": "list", "data": data}
    else:
        route = gw.routes.get(model_id)
        if route is None or not key.may_call(route):
            raise GatewayError(404, f"model '{model_id}' does not exist", code="model_not_found")
        body = obj(route)
    raw = json.dumps(body).encode()
    await reply.start(
        200, [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    )
    await reply.send({"type": "http.response.body", "body": b"" if head else raw})


async def _lifespan(receive, send) -> None:
    """uvicorn's start and stop; Daphne has none, so the gateway also starts on first use."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            gw = gateway()
            if gw.started:
                await gw.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
