"""Limits on the HTTP request head for Daphne (Twisted's HTTP/1.1 parser), applied at start.

Twisted's own limits bound a head's size (16 KiB) but not its time: its idle
timer restarts on every byte, so a client sending one header line every 20 s
keeps a connection for hours, and a few hundred such clients exhaust the
server. It also accepts a second ``Transfer-Encoding`` line after ``chunked``,
which RFC 9112 says must be refused (a proxy that reads the last one would
frame the body differently: request smuggling). ``install()`` adds:

- a deadline for the whole head of each request (``LLMGW_HTTP_HEAD_TIMEOUT_S``,
  from its first byte to its blank line); past it the client gets 408 and the
  connection is closed;
- a cap on header lines (``LLMGW_HTTP_MAX_HEADERS``; Twisted allows 500);
- exactly one ``Transfer-Encoding`` line, and only ``chunked``: anything else
  is 400, as is ``Transfer-Encoding`` beside ``Content-Length`` (Twisted
  already refuses that).

Bodies are bounded where they are read (the gateway, Django's upload limits);
WebSocket frames by Daphne's own limits.
"""

import logging

from twisted.internet import reactor
from twisted.web import http

logger = logging.getLogger(__name__)

_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
)
_installed = False


def install(head_timeout_s: float, max_headers: int) -> None:
    """Patch Twisted's HTTPChannel in this process. Idempotent; call before serving."""
    global _installed
    if _installed:
        return
    _installed = True
    channel = http.HTTPChannel
    channel.maxHeaders = max_headers
    original_data = channel.dataReceived
    original_headers = channel.allHeadersReceived
    original_lost = channel.connectionLost
    original_choose = channel._maybeChooseTransferDecoder

    def dataReceived(self, data):
        # The first byte of a request head starts its clock; the keep-alive
        # wait before it is the idle timer's business.
        if getattr(self, "_llmgw_head_timer", None) is None and self.line_mode:
            if not self._handlingRequest:
                self._llmgw_te_seen = False
                self._llmgw_head_timer = reactor.callLater(head_timeout_s, _head_too_slow, self)
        return original_data(self, data)

    def allHeadersReceived(self):
        _cancel(self)
        return original_headers(self)

    def connectionLost(self, reason):
        _cancel(self)
        return original_lost(self, reason)

    def _maybeChooseTransferDecoder(self, header, data):
        if header == b"Transfer-Encoding":
            if getattr(self, "_llmgw_te_seen", False) or data.strip().lower() != b"chunked":
                return self._failChooseTransferDecoder()
            self._llmgw_te_seen = True
        return original_choose(self, header, data)

    channel.dataReceived = dataReceived
    channel.allHeadersReceived = allHeadersReceived
    channel.connectionLost = connectionLost
    channel._maybeChooseTransferDecoder = _maybeChooseTransferDecoder


def _cancel(channel) -> None:
    timer = getattr(channel, "_llmgw_head_timer", None)
    channel._llmgw_head_timer = None
    if timer is not None and timer.active():
        timer.cancel()


def _head_too_slow(channel) -> None:
    channel._llmgw_head_timer = None
    peer = channel.transport.getPeer() if channel.transport else None
    logger.warning(
        "request head not complete in time; closing client=%s:%s",
        getattr(peer, "host", "?"),
        getattr(peer, "port", "?"),
    )
    channel.transport.write(_TIMEOUT_RESPONSE)
    channel.transport.loseConnection()
