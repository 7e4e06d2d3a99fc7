"""The agent's own log, and reading the last lines of any log for a logs_request."""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
from pathlib import Path

AGENT_SOURCE = "agent"
# A logs_reply travels in one WebSocket message, and Daphne refuses messages
# over 1 MiB. Keep well under it, dropping the oldest lines first.
REPLY_BUDGET_BYTES = 768 * 1024
MAX_LINE_CHARS = 4096  # protocol.fields.Text's limit

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def setup(log_path: Path | None, level: str = "INFO") -> None:
    """Log to stderr (for the service manager's journal) and to a rotating file.

    The file is what a logs_request reads, so the control plane can show an
    agent's log without anyone logging into the node.
    """
    root = logging.getLogger()
    root.setLevel(level)
    for h in list(root.handlers):
        root.removeHandler(h)
    formatter = logging.Formatter(FORMAT)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(formatter)
    root.addHandler(console)
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            log_path, maxBytes=10 * 2**20, backupCount=3, encoding="utf-8"
        )
        handler.setFormatter(formatter)
        root.addHandler(handler)
    # websockets logs every handshake failure with a traceback; the client says
    # what happened in one line instead.
    logging.getLogger("websockets").setLevel(logging.WARNING)


def tail(path: Path, lines: int, *, chunk: int = 64 * 1024) -> list[str]:
    """The last ``lines`` lines of a file, read backwards so a big log costs little."""
    if lines <= 0:
        return []
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        data = b""
        pos = end
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(chunk, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    text = data.decode("utf-8", errors="replace")
    out = text.splitlines()
    return out[-lines:]


def fit_reply(lines: list[str], budget: int = REPLY_BUDGET_BYTES) -> list[str]:
    """Lines cut to the protocol's length, oldest dropped until they fit the budget."""
    cut = [ln[:MAX_LINE_CHARS] for ln in lines]
    total = 0
    keep = 0
    for ln in reversed(cut):
        cost = len(json.dumps(ln)) + 2  # as it will travel: escaped, quoted, comma
        if total + cost > budget:
            break
        total += cost
        keep += 1
    return cut[len(cut) - keep :]
