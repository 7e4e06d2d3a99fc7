"""The value rules every message of protocol v1 shares.

Identifiers' patterns, bounded strings and integers (bounded by the columns they
end up in), and the two bases every message and part derives from, strict and
frozen. This module changes when what a value on the wire may be changes; the
messages themselves are grouped by subject beside it (``agentd.protocol``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# A node id names a channel-layer group and appears in URLs, so it keeps to
# characters that are safe in both.
NODE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


SHARD_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


NodeId = Annotated[str, Field(pattern=NODE_ID_PATTERN)]


ShardId = Annotated[str, Field(pattern=SHARD_ID_PATTERN)]


ShortStr = Annotated[str, Field(max_length=255)]


Text = Annotated[str, Field(max_length=4096)]


# Integers are bounded by the columns they end up in: an unbounded int from the
# wire would pass validation and then fail in the database, after the socket
# had already been told its message was fine.
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]  # a bigint column


# Desired-set versions: room left above any reported one, since the control plane
# continues numbering past what an agent reports (after a database restore).
Version = Annotated[int, Field(ge=0, le=2**62)]


SmallCount = Annotated[int, Field(ge=0, le=2**31 - 1)]  # an integer column


Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]


GpuIndex = Annotated[int, Field(ge=0, le=32767)]  # a smallint column


Labels = Annotated[dict[Annotated[str, Field(max_length=63)], ShortStr], Field(max_length=64)]


# A network interface's name as Linux allows it (IFNAMSIZ is 16 with the NUL);
# it ends up in engines' environments, so nothing but a name.
IfName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:@-]{0,15}$")]


Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


# Strict: "1" is not a number and "yes" is not a boolean; a sender that gets a
# type wrong is told so instead of being guessed at. No NaN or infinity either:
# they are not JSON, and nothing downstream could show or compare them.
CONFIG = ConfigDict(extra="ignore", frozen=True, strict=True, allow_inf_nan=False)


class Msg(BaseModel):
    model_config = CONFIG
    v: Literal[1] = 1


class Part(BaseModel):
    model_config = CONFIG


def unique(items: list, key: str, what: str) -> list:
    """Refuse a list naming the same thing twice: the inventory keeps one row per key."""
    seen = set()
    for item in items:
        value = getattr(item, key)
        if value in seen:
            raise ValueError(f"{what} {value!r} appears more than once")
        seen.add(value)
    return items
