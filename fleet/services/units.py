"""Megabytes and gigabytes: one divisor for every comparison and every message.

Memory is compared in decimal GB: a machine's MemTotal is a little under its
nominal size, and "a 32 GB node" should still hold a profile that needs 32.
Messages use the same divisor and never round up, so a node refused for
memory never reads as if it had enough: 7,900 MB asked for 8 GB reads
"has 7.9 GB of memory, needs 8", not "has 8 GB, needs 8".
"""

import math

MB_PER_GB = 1000


def gb_text(mb: int) -> str:
    """``mb`` in GB for people: whole when exact, else rounded down to a tenth ("7.9")."""
    if mb % MB_PER_GB == 0:
        return str(mb // MB_PER_GB)
    tenths = math.floor(mb * 10 / MB_PER_GB)
    return f"{tenths // 10}.{tenths % 10}"
