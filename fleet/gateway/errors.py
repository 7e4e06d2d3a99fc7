"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``, and on
/v1/messages in Anthropic's: ``{"type": "error", "error": {"type", "message"}}``.

Clients (the official SDKs included) read the message and map the HTTP status to
an exception class, so both must say what went wrong.
"""

import json

# The ``type`` OpenAI uses for each status, so SDKs and users recognise them.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


# Anthropic's ``error.type`` for each status (its API's errors page); 503 is its
# overloaded_error, which its SDK retries like a 529.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class GatewayError(Exception):
    """A request the gateway answers itself, with a status and a message naming the problem."""

    extra_headers: list[tuple[bytes, bytes]] = []  # a 429's x-ratelimit-* headers

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self, api: str | None = None) -> bytes:
        return error_body(self.status, self.message, param=self.param, code=self.code, api=api)

    def answer(self, api: str | None = None) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """The headers, with the body's length, and the body: one write, no chunks.
        ``api`` "messages": in Anthropic's shape."""
        body = self.body(api)
        return [*self.headers(), (b"content-length", b"%d" % len(body))], body

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode()))
        if self.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        return headers + self.extra_headers


def internal() -> GatewayError:
    """A bug, not the client's doing: the 500 in OpenAI's shape (the traceback goes to the log)."""
    return GatewayError(500, "the gateway failed; see its log", code="internal")


def error_body(status: int, message: str, *, param=None, code=None, api=None) -> bytes:
    """An error answer's body: OpenAI's shape, or Anthropic's where ``api`` is "messages"."""
    if api == "messages":
        return json.dumps(anthropic_error(status, message)).encode()
    return json.dumps(
        {
            "error": {
                "message": message,
                "type": _TYPES.get(
                    status, "server_error" if status >= 500 else "invalid_request_error"
                ),
                "param": param,
                "code": code,
            }
        }
    ).encode()


def anthropic_error(status: int, message: str) -> dict:
    """Anthropic's error object, as its answers and its streams' error events carry it."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def sse_error_event(message: str, code: str = "upstream_error") -> bytes:
    """An error in the middle of a stream: the status line has gone, so it travels as an event."""
    payload = json.loads(error_body(502, message, code=code))
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
