"""Logging filters for llmgw_site/settings.py's LOGGING."""

import logging

# What uvicorn says of every WebSocket at INFO, three lines a socket. The agent
# consumer logs each agent socket's open and end itself, with its node
# (fleet/consumers.py); after a restart 5,000 agents made 30,000 of these lines,
# a write each, on the event loop that was registering them.
_SOCKET_CHATTER = {"connection open", "connection closed", '%s - "WebSocket %s" [accepted]'}


class QuietSockets(logging.Filter):
    """Drops uvicorn's per-WebSocket INFO lines; keeps everything else it logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.msg in _SOCKET_CHATTER)
