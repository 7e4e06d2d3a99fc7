"""A shard's output: the engine writes a log file of its own; the agent keeps its recent lines.

The engine's stdout and stderr go straight to the file (not through a pipe to the
agent), so the engine never blocks or dies on a broken pipe when the agent is gone.
The agent reads what is new into a ring of recent lines, for failure reports,
and rotates the file when it grows too big.

What of it goes back to the control plane (a failed shard's last output, an
adapter's failure reason in the engine's words) is ``reportable``: a few lines,
each cleaned and cut, about 1 KiB in all. An engine prints what it was given and
sometimes what it read (llama.cpp quotes a file's first bytes when they are not
a GGUF's magic); the log file keeps everything, the control plane sees a bounded
summary with such bytes left out.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
from pathlib import Path

RING_LINES = 1000
MAX_LOG_BYTES = 64 * 1024 * 1024
_MAX_READ = 4 * 1024 * 1024  # per look: a burst beyond this keeps only its end

# What the control plane is told of an engine's output: at most these lines, each at
# most these characters, and these characters in all.
REPORT_LINES = 8
REPORT_LINE_CHARS = 240
REPORT_CHARS = 1024

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Bytes an engine read and quotes back: llama.cpp's gguf reader names a file's first
# four bytes when they are not "GGUF" (gguf.cpp: "invalid magic characters: '%c%c%c%c'").
_ECHOED = re.compile(r"(invalid magic characters:?\s*)'.*?'(?=,\s*expected|$)", re.IGNORECASE)


def clean_line(line: str, limit: int = REPORT_LINE_CHARS) -> str:
    """One line of an engine's output fit to be reported: terminal colours and control
    characters dropped, bytes it quotes from a file it read left out, cut to ``limit``."""
    line = _CONTROL.sub("", _ANSI.sub("", line)).strip()
    line = _ECHOED.sub(r"\1(the file's first bytes, not shown)", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def reportable(
    lines: list[str], max_lines: int = REPORT_LINES, max_chars: int = REPORT_CHARS
) -> list[str]:
    """The last of ``lines`` that fit the bounds, cleaned, in their order; empty ones dropped."""
    out: list[str] = []
    total = 0
    for line in reversed(lines):
        text = clean_line(line)
        if not text:
            continue
        if len(out) == max_lines or total + len(text) > max_chars:
            break
        out.append(text)
        total += len(text)
    return out[::-1]


def bounded(text: str, max_chars: int = REPORT_CHARS) -> str:
    """A reason that carries an engine's words, cleaned and cut to ``max_chars``."""
    return clean_line(text.replace("\n", " "), max_chars)


class ShardLog:
    def __init__(self, path: Path):
        self.path = path
        self.ring: collections.deque[str] = collections.deque(maxlen=RING_LINES)
        self._pos = 0
        self._partial = b""

    def skip_to_end(self) -> None:
        """Read from here on: the lines before are an earlier process's (ring keeps a few)."""
        self.ring.extend(tail_file(self.path, 50))
        try:
            self._pos = self.path.stat().st_size
        except FileNotFoundError:
            self._pos = 0
        self._partial = b""

    def read_new(self) -> None:
        """Move the engine's new output into the ring; rotate the file when it is too big."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size < self._pos:
            self._pos, self._partial = 0, b""  # truncated under us
        if size > self._pos:
            start = max(self._pos, size - _MAX_READ)
            with open(self.path, "rb") as fh:
                fh.seek(start)
                data = self._partial + fh.read(size - start)
            self._pos = size
            *lines, self._partial = data.split(b"\n")
            self.ring.extend(ln.decode("utf-8", "replace").rstrip("\r") for ln in lines)
        if size > MAX_LOG_BYTES:
            # The engine holds the file open in append mode, so copy and truncate:
            # its next write lands at the start of the emptied file.
            shutil.copyfile(self.path, self.path.with_suffix(".log.1"))
            os.truncate(self.path, 0)
            self._pos, self._partial = 0, b""

    def recent(self, lines: int) -> list[str]:
        """The last lines seen, fit for the protocol (no NUL, at most 4096 characters each)."""
        return [ln.replace("\x00", "")[:4096] for ln in list(self.ring)[-lines:]]

    def tail(self, lines: int) -> list[str]:
        return tail_file(self.path, lines)


def tail_file(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a file, read backwards in blocks."""
    if lines <= 0:
        return []
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return []
    with fh:
        end = fh.seek(0, os.SEEK_END)
        data, pos = b"", end
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    return data.decode("utf-8", "replace").splitlines()[-lines:]
