"""A text frame that is not UTF-8 closes the agent socket with 1007, quietly.

The finding: under the default server (``llmgw_site.serve``, uvicorn) such a frame
logged a traceback. A real web process, and a client written here byte by byte,
since a WebSocket library will not send invalid UTF-8 as text.
"""

import asyncio
import base64
import os
import struct

import pytest

from tests.consumer.test_live_agent_socket import enrol

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def frame(opcode: int, payload: bytes) -> bytes:
    """One final client frame, masked as a client's must be."""
    mask = os.urandom(4)
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    else:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def read_frame(reader) -> tuple[int, bytes]:
    first, second = await reader.readexactly(2)
    n = second & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    return first & 0x0F, await reader.readexactly(n)


async def open_socket(server, credential: str):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            "GET /ws/agent/ HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{server.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {credential}\r\n\r\n"
        ).encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


async def test_a_text_frame_of_invalid_utf8_closes_with_1007_and_no_traceback(live_web):
    # given an agent's accepted socket
    credential = await enrol(live_web, "gpu-01")
    reader, writer = await open_socket(live_web, credential)

    # when it sends a text frame that is not UTF-8
    writer.write(frame(0x1, b'{"type": "register", "node_id": "\xff\xfe"}'))
    await writer.drain()

    # then the server closes it with 1007 (invalid frame payload data)
    while True:
        opcode, payload = await asyncio.wait_for(read_frame(reader), 10)
        if opcode == 0x8:
            break
    assert struct.unpack("!H", payload[:2])[0] == 1007
    writer.close()

    # and its log says so in a line, without a traceback
    log = live_web.output()
    assert "Traceback" not in log
    assert "UnicodeDecodeError" not in log
    assert "not UTF-8" in log
