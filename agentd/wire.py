"""How a raw message crosses the socket, before and around the schema.

The protocol version, the close codes, ``ProtocolError``, and ``decode``: the
checks every message passes before ``agentd.protocol``'s models see it (JSON
text, an object, a known type, this version, no U+0000). The message models
themselves live in ``agentd.protocol``, which re-exports everything here, so
both ends keep importing from there.
"""

from __future__ import annotations

import enum
import json

from pydantic import TypeAdapter, ValidationError

VERSION = 1


class CloseCode(enum.IntEnum):
    """WebSocket close codes the control plane uses. 1009 (too big) comes from Daphne."""

    NORMAL = 1000  # the agent said goodbye, or the server is shutting down
    # Too busy to register in time (a whole fleet reconnecting): back off and retry.
    # WebSocket's own 1013 is refused by Daphne's autobahn, which takes 1000 and 3000-4999.
    TRY_AGAIN = 4013
    INVALID_MESSAGE = 4000  # not JSON, a binary frame, an unknown type, or a field fails
    UNSUPPORTED_VERSION = 4001  # "v" is not a version this end speaks
    NOT_REGISTERED = 4002  # a message before "register"
    FORBIDDEN = 4003  # the credential does not authorise this node
    SUPERSEDED = 4009  # the same node connected again; the new socket wins
    RATE_LIMITED = 4029  # more messages or bytes than the control plane takes from one node
    REVOKED = 4010  # the node's credential was revoked while connected


class ProtocolError(ValueError):
    """A message that does not follow the protocol. ``code`` is the close code to use."""

    def __init__(self, code: CloseCode, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _summarise(err: ValidationError) -> str:
    first = err.errors(include_url=False)[0]
    loc = list(first["loc"])[1:]  # the first element is the discriminator's tag
    where = ".".join(str(p) for p in loc) or "message"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _find_nul(data) -> bool:
    # Iterative, so a deeply nested message cannot exhaust the stack here.
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _may_hold_nul(raw: str | bytes | dict) -> bool:
    if isinstance(raw, str):
        return "\\u0000" in raw
    if isinstance(raw, bytes | bytearray):
        return b"\\u0000" in raw
    return True


def decode(raw: str | bytes | dict, adapter: TypeAdapter, known: set[str]):
    """Validate ``raw`` against ``adapter`` if its type is in ``known``, or raise ProtocolError."""
    if isinstance(raw, dict):
        data = raw
    else:
        try:
            data = json.loads(raw, parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(CloseCode.INVALID_MESSAGE, f"not JSON: {exc}") from None
        except RecursionError:
            raise ProtocolError(CloseCode.INVALID_MESSAGE, "not JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ProtocolError(CloseCode.INVALID_MESSAGE, "a message must be a JSON object")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in known:
        # Cut short: the reason is logged and sent back, and the sender chose it.
        raise ProtocolError(CloseCode.INVALID_MESSAGE, f"unknown message type {kind!r:.40}")
    version = data.get("v")
    # type() rather than ==: true == 1 and 1.0 == 1 in Python, not on the wire.
    if type(version) is not int or version != VERSION:
        raise ProtocolError(
            CloseCode.UNSUPPORTED_VERSION,
            f"protocol version {version!r:.20} is not supported; this end speaks {VERSION}",
        )
    # PostgreSQL cannot store U+0000 in text, so a string holding one would pass
    # here and fail at the database; the sender must strip it (engine output can
    # carry them).
    # JSON text can only carry U+0000 as the escape \u0000 (a raw control
    # character is not JSON), so text without that escape needs no walk.
    if _may_hold_nul(raw) and _find_nul(data):
        raise ProtocolError(CloseCode.INVALID_MESSAGE, f"{kind}: a string contains U+0000")
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise ProtocolError(CloseCode.INVALID_MESSAGE, f"{kind}: {_summarise(exc)}") from None
