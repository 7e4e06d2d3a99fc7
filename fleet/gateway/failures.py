"""How an attempt at a replica fails, and what the client is told.

Each failure is counted (``metrics.upstream_error``, by kind) and worded for the
client once: a failed connect, a dropped connection or a 502/503 before any answer
is a ``Retry`` (another replica may take the request, nothing having reached the
client); a broken bound, no answer in time or an answer cut short is the 502 or
504 itself; an engine's own error is put in the shape of the request's API
(OpenAI's, or Anthropic's on /v1/messages); a stream that fails once started ends
with that API's error events (``stream_error``). A replica that fails to connect
``cooldown_after`` times in a row, or sends no answer in time, is set aside for
``cooldown_s``.
"""

import json
import logging
import time

from . import metrics, table
from .errors import GatewayError, anthropic_error, error_body, sse_error_event
from .http1 import ConnectFailed, Disconnected, Refused, UpstreamError

logger = logging.getLogger(__name__)


class Retry(Exception):
    """An attempt that failed before anything reached the client: another replica may
    take the request; ``why`` says what went wrong, for the log and the last 502."""

    def __init__(self, why: str):
        self.why = why


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
