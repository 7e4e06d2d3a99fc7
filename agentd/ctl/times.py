"""The times operators type on llmgw's command line: how far back (``--since 7d``),
through which day (``--to 2026-11-30``) and how far ahead (a notice's ``--in 2m``).
Changes when a way of writing a time does. ``manage.py notice`` and the admin's notice
form read a time ahead with ``notice_seconds`` too, so the three agree.
"""

from __future__ import annotations

import datetime
import time

UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def ago(text: str) -> str:
    """'24h', '7d' … as the ISO 8601 time that long ago (UTC); an ISO time as it is."""
    number, unit = text[:-1], text[-1:]
    if unit in UNITS_S and number.isdigit():
        when = time.time() - int(number) * UNITS_S[unit]
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    return text


def through(text: str | None) -> str | None:
    """--to as the API's end: a date is through that day (the next midnight); a time as
    it is."""
    try:
        day = datetime.date.fromisoformat(text or "")
    except ValueError:
        return text
    return (day + datetime.timedelta(days=1)).isoformat()


def notice_seconds(text: str) -> float:
    """A notice's time ahead: '120' (seconds), '120s', '2m', '1h'. ValueError naming it."""
    given = str(text).strip().lower()
    number, unit = (given[:-1], given[-1]) if given[-1:] in UNITS_S else (given, "s")
    try:
        seconds = float(number.strip()) * UNITS_S[unit]
    except ValueError:
        seconds = -1.0
    if not number.strip() or not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"--in '{text}' is not a time ahead: give seconds (120) or 120s, 2m, 1h")
    return seconds
