"""Before Django: which /v1 paths are the Batch API's, and their bodies bounded.

Django's ASGI handler reads a whole body before any view sees it, so the bound
is here: a declared ``Content-Length`` over the limit is a 413 and a body with
none (chunked) is a 411, answered without reading a byte of it; uvicorn then
delivers no more than the declared length.
"""

from fleet.conf import fleet_settings
from fleet.gateway.errors import error_body

PREFIXES = ("/v1/files", "/v1/batches")
# Room for a multipart upload's boundaries and its other fields.
_MULTIPART_SLACK = 1 << 20
# Any other body of theirs: a batch's creation, a few hundred bytes.
OTHER_MAX_BYTES = 1 << 20


def handles(path: str) -> bool:
    return path.startswith(PREFIXES) and (
        path in PREFIXES or path.startswith(("/v1/files/", "/v1/batches/"))
    )


def limit_for(scope) -> int:
    if scope["method"] == "POST" and scope["path"] == "/v1/files":
        return fleet_settings().batch_file_max_bytes + _MULTIPART_SLACK
    return OTHER_MAX_BYTES


async def bounded(app, scope, receive, send) -> None:
    """``app`` (Django) for a Batch API request whose body is within its bound."""
    length = chunked = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = value
        elif name == b"transfer-encoding":
            chunked = value
    limit = limit_for(scope)
    refusal = None
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            refusal = (400, "the Content-Length header is not a number", None)
        else:
            if declared > limit:
                refusal = (
                    413,
                    f"the request body is {declared} bytes; the limit is {limit} "
                    "(LLMGW_BATCH_FILE_MAX_BYTES for a file)",
                    "request_too_large",
                )
    elif chunked is not None:
        refusal = (411, "send the body with a Content-Length", "length_required")
    if refusal is None:
        await app(scope, receive, send)
        return
    status, message, code = refusal
    body = error_body(status, message, code=code)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
