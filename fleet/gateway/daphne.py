"""Under Daphne, /v1/* requests are checked when their headers are in, before their body is read.

Daphne (through Twisted) reads a request's whole body, to a temporary file if
it is large, before it calls the application; so the app's own checks (key
first, then a bounded read) come too late there: an anonymous client could
make it read 512 MiB before hearing 401. This puts the same checks at the
moment the headers are complete:

- a ``Content-Length`` over the route's limit is 413 at once; a body without
  one (chunked) is counted as it arrives and refused when it passes the limit;
- on the proxied routes the API key is checked (``Gateway.key_for``, the
  app's own check) while the connection is paused, so no body byte is read
  for a client without a valid key;
- other /v1/* paths take no body, so one over ``_NO_BODY_LIMIT`` is 413.

A refusal is the app's answer in OpenAI's shape, with ``Connection: close``;
the connection then closes, and what the client still sends is never read.
Under uvicorn (``llmgw_site.gateway_asgi``) bodies already stream, and the app
does this itself. ``install()`` is called by ``llmgw_site.asgi``, which Daphne
imports before it listens.
"""

import asyncio
import io
import logging
from http import HTTPStatus

from . import keys
from .app import PROXIED
from .errors import GatewayError, internal
from .state import gateway

logger = logging.getLogger(__name__)

# /v1/models and unknown /v1/* paths read no body; this leaves room for a
# client that sends an empty JSON object anyway.
_NO_BODY_LIMIT = 64 << 10


def install() -> bool:
    """Make Daphne build guarded requests; False (and a warning) if Daphne is not as expected."""
    try:
        from daphne import http_protocol
    except ImportError:
        return False
    if getattr(http_protocol.WebRequest, "_llmgw_guarded", False):
        return True
    if not hasattr(http_protocol.HTTPFactory, "buildProtocol"):
        logger.warning("daphne's HTTPFactory has changed: /v1/* bodies are read before checks")
        return False
    http_protocol.WebRequest = _guarded(http_protocol.WebRequest)
    return True


def _guarded(base):
    class GuardedRequest(base):
        """Daphne's request, with the gateway's checks between the headers and the body."""

        _llmgw_guarded = True
        _state = "open"  # "open": no checks; "checking"; "allowed"; "refused"
        _limit = 0
        _received = 0
        _process_later = False
        _path = b""
        _too_large = None

        def gotLength(self, length):
            path = self._path = self.channel._path.split(b"?", 1)[0]
            if not path.startswith(b"/v1/"):
                return super().gotLength(length)
            try:
                self._check_head(path, length)
            except GatewayError as exc:
                self._refuse(exc)
                return
            super().gotLength(length)

        def _check_head(self, path: bytes, length: int | None) -> None:
            endpoint = PROXIED.get(path.decode("latin-1"))
            if endpoint is None:
                self._limit = _NO_BODY_LIMIT
            else:
                self._limit = _limits().max_body_bytes[endpoint]
            self._state = "allowed"
            checks_key = endpoint is not None and self.channel._command == b"POST"
            entry = None
            if checks_key:
                # As the app does: the key first, so an anonymous client learns nothing more.
                headers = [
                    (name.lower(), value)
                    for name, values in self.requestHeaders.getAllRawHeaders()
                    for value in values
                ]
                gw = gateway()
                if gw.started:
                    entry = gw.known_key(headers)
                else:
                    keys.bearer(headers)  # refuses a missing or malformed key at once
            too_large = None
            if length is not None and length > self._limit:
                too_large = GatewayError(
                    413,
                    f"the request body is {length} bytes; the limit is {self._limit}",
                    code="request_too_large",
                )
            if not checks_key or entry is not None:
                if too_large is not None:
                    raise too_large
                return  # a known, valid key; or a path the app answers without a body
            self._too_large = too_large  # told once the key has proved good
            # Unknown here: perhaps made a moment ago elsewhere, perhaps not started
            # yet. Read nothing more from the client until the app's check says.
            self._state = "checking"
            self.channel.transport.pauseProducing()
            task = asyncio.ensure_future(_check_key(gw, headers))
            task.add_done_callback(self._key_checked)

        def _key_checked(self, task: asyncio.Future) -> None:
            if self._state != "checking":
                return  # refused meanwhile, or the connection went
            exc = task.exception() if not task.cancelled() else None
            if exc is not None:
                if not isinstance(exc, GatewayError):
                    logger.error("checking a key before the body failed: %r", exc)
                    exc = internal()
                self._refuse(exc)
                return
            if self._too_large is not None:
                self._refuse(self._too_large)
                return
            self._state = "allowed"
            if self.channel.transport is not None:
                self.channel.transport.resumeProducing()
            if self._process_later:
                super().process()

        def handleContentChunk(self, data):
            if self._state == "refused":
                return
            self._received += len(data)
            if self._state != "open" and self._received > self._limit:
                self._refuse(
                    GatewayError(
                        413,
                        f"the request body is over the limit of {self._limit} bytes",
                        code="request_too_large",
                    )
                )
                return
            super().handleContentChunk(data)

        def process(self):
            if self._state == "checking":
                self._process_later = True  # the whole body came with the headers
                return None
            if self._state == "refused":
                return None
            return super().process()

        def connectionLost(self, reason):
            if self._state == "checking":
                self._state = "refused"  # nobody left to answer
            super().connectionLost(reason)

        def _refuse(self, exc: GatewayError) -> None:
            from . import metrics

            self._state = "refused"
            if getattr(self, "content", None) is not None:
                self.content.close()
            self.content = io.BytesIO()
            # Twisted would otherwise invite the body after this answer.
            self.requestHeaders.removeHeader(b"expect")
            headers, body = exc.answer()
            lines = [f"HTTP/1.1 {exc.status} {HTTPStatus(exc.status).phrase}".encode()]
            for name, value in headers:
                lines.append(name + b": " + value)
            lines.append(b"connection: close")
            transport = self.channel.transport
            transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
            transport.loseConnection()
            metrics.count_unrouted(exc.status)
            logger.info(
                "request refused before its body status=%d path=%s: %s",
                exc.status,
                self._path[:200].decode("latin-1"),
                exc.message,
            )

    GuardedRequest.__name__ = GuardedRequest.__qualname__ = "GuardedRequest"
    return GuardedRequest


def _limits():
    return gateway().limits


async def _check_key(gw, headers) -> None:
    await gw.ensure_started()
    await gw.key_for(headers)
