"""Logging filters for llmgw_site/settings.py's LOGGING."""

import logging

# What uvicorn says of every WebSocket at INFO, three lines a socket. The agent
# consumer logs each agent socket's open and end itself, with its node
# (fleet/sockets/consumer.py); after a restart 5,000 agents made 30,000 of these lines,
# a write each, on the event loop that was registering them.
_SOCKET_CHATTER = {"connection open", "connection closed", '%s - "WebSocket %s" [accepted]'}


class QuietSockets(logging.Filter):
    """Drops uvicorn's per-WebSocket INFO lines; keeps everything else it logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.msg in _SOCKET_CHATTER)


# uvicorn's websockets-sansio logs this with the decoder's traceback when a client
# sends a text frame that is not UTF-8, then closes the socket with 1007 as it
# should. A peer's bad bytes are not the server's fault: one line, no traceback.
_BAD_TEXT_FRAME = "Invalid UTF-8 sequence received from client."


class QuietBadFrames(logging.Filter):
    """Turns uvicorn's traceback for a text frame of invalid UTF-8 into one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _BAD_TEXT_FRAME and record.exc_info:
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = (
                "a WebSocket client sent a text frame that is not UTF-8; closed it with 1007"
            )
            record.args = ()
        return True
