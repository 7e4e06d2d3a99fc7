"""Checking a batch input file line by line: the first bad line is a 400 that names it.

Each line is one request, as OpenAI's Batch API takes it::

    {"custom_id": "q-1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

``check`` reads the lines once, in order, holding only the custom_ids seen, and
returns what a batch needs to know of the file (its lines, the first line of
each URL and model). The body of each line is checked by the gateway's own rule
for its endpoint (``check_body``, given by the caller: ``fleet.gateway.validate``),
so a line that would be a 400 at the gateway is a 400 at upload instead.
"""

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

# The URLs a batch line may name, and the gateway endpoint each is.
ENDPOINTS = {
    "/v1/chat/completions": "chat/completions",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
CUSTOM_ID_MAX = 512
# Distinct models one file may name: a batch is usually one, and each is looked
# up when the batch is checked.
MODELS_MAX = 100
# What a line holds besides its body: the envelope's keys and a custom_id.
_ENVELOPE_BYTES = 4096


class LineError(ValueError):
    """A line that cannot be run; ``line`` is its number from 1 (0: the file as a whole)."""

    def __init__(self, line: int, message: str, param: str | None = None):
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.param = param


class BodyError(ValueError):
    """What ``check_body`` raises for a body the gateway would refuse."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class Checked:
    lines: int = 0
    urls: dict[str, int] = field(default_factory=dict)  # url -> its first line
    models: dict[str, int] = field(default_factory=dict)  # model -> its first line

    def summary(self) -> dict:
        return {"urls": self.urls, "models": self.models}


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def check(
    lines: Iterable[bytes],
    *,
    max_lines: int,
    max_body_bytes: Mapping[str, int],
    check_body: Callable[[str, bytes], None],
) -> Checked:
    """The file's facts, or the LineError of its first bad line."""
    out = Checked()
    seen: dict[str, int] = {}
    longest = max(max_body_bytes.values()) + _ENVELOPE_BYTES
    n = 0
    for n, raw in enumerate(lines, start=1):
        if n > max_lines:
            raise LineError(0, f"the file has more than {max_lines} lines, the most a batch takes")
        raw = raw.rstrip(b"\r\n")
        if len(raw) > longest:
            raise LineError(n, f"the line is {len(raw)} bytes; a request may be {longest} at most")
        request = _decode(n, raw)
        _check_line(n, request, seen, out, max_body_bytes, check_body)
    if n == 0:
        raise LineError(0, "the file is empty: a batch needs at least one line")
    out.lines = n
    return out


def _decode(n: int, raw: bytes) -> dict:
    if not raw.strip():
        raise LineError(n, "the line is empty; each line must be one request")
    try:
        request = _DECODER.decode(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise LineError(n, "the line is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise LineError(n, f"the line is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise LineError(n, "the line must be a JSON object with custom_id, method, url and body")
    return request


def _check_line(n, request, seen, out, max_body_bytes, check_body) -> None:
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError(n, "'custom_id' must be a non-empty string", "custom_id")
    if len(custom_id) > CUSTOM_ID_MAX:
        raise LineError(n, f"'custom_id' is longer than {CUSTOM_ID_MAX} characters", "custom_id")
    if (first := seen.get(custom_id)) is not None:
        raise LineError(
            n,
            f"custom_id '{custom_id[:80]}' is used by line {first} already; each line needs "
            "its own",
            "custom_id",
        )
    seen[custom_id] = n
    if request.get("method") != "POST":
        raise LineError(n, f"'method' must be \"POST\", not {request.get('method')!r}", "method")
    url = request.get("url")
    endpoint = ENDPOINTS.get(url) if isinstance(url, str) else None
    if endpoint is None:
        raise LineError(n, f"'url' {url!r} is not one a batch runs: {', '.join(ENDPOINTS)}", "url")
    body = request.get("body")
    if not isinstance(body, dict):
        raise LineError(n, "'body' must be a JSON object: the request to send", "body")
    if body.get("stream") not in (None, False):
        raise LineError(
            n, "'body.stream' must be false or absent: a batch's answers are whole", "body.stream"
        )
    raw_body = json.dumps(body, separators=(",", ":")).encode()
    limit = max_body_bytes[endpoint]
    if len(raw_body) > limit:
        raise LineError(n, f"'body' is {len(raw_body)} bytes; {url} takes {limit} at most", "body")
    try:
        check_body(endpoint, raw_body)
    except BodyError as exc:
        raise LineError(n, f"body: {exc}", f"body.{exc.param}" if exc.param else "body") from None
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise LineError(n, "'body.model' must name the model to use", "body.model")
    out.urls.setdefault(url, n)
    if model not in out.models:
        if len(out.models) >= MODELS_MAX:
            raise LineError(n, f"the file names more than {MODELS_MAX} models", "body.model")
        out.models[model] = n
