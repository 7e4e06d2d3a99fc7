"""Bad input on the agent socket: each closes with its documented code and reason,
is logged once, and writes nothing.

(A frame over Daphne's 1 MiB limit is refused by Daphne itself, before the
consumer sees it: tests/consumer/test_live_agent_socket.py covers it on a real server.)
"""

import json
import logging

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentd import protocol
from agentd.protocol import CloseCode, ProtocolError
from tests.consumer.helpers import communicator, db, enrol, expect_close, register, snapshot
from tests.consumer.strategies import fuzzed_messages, json_values
from tests.factories import heartbeat_msg, register_msg

pytestmark = pytest.mark.django_db(transaction=True)

BAD = [
    # (what, frame, close code, words in the reason)
    (
        "malformed JSON",
        "text",
        '{"type": "heartbeat", "v": 1',
        CloseCode.INVALID_MESSAGE,
        "not JSON",
    ),
    ("non-object JSON", "text", '["register"]', CloseCode.INVALID_MESSAGE, "JSON object"),
    ("JSON null", "text", "null", CloseCode.INVALID_MESSAGE, "JSON object"),
    ("unknown type", "text", '{"type": "reboot", "v": 1}', CloseCode.INVALID_MESSAGE, "'reboot'"),
    ("no type", "text", '{"v": 1, "node_id": "gpu-01"}', CloseCode.INVALID_MESSAGE, "type None"),
    (
        "wrong field type",
        "text",
        json.dumps(register_msg("gpu-01", gpus="eight")),
        CloseCode.INVALID_MESSAGE,
        "register: gpus",
    ),
    (
        "a number as a string",
        "text",
        json.dumps(register_msg("gpu-01", memory_total_mb="2063500")),
        CloseCode.INVALID_MESSAGE,
        "memory_total_mb",
    ),
    (
        "missing node_id",
        "text",
        json.dumps({k: v for k, v in register_msg().items() if k != "node_id"}),
        CloseCode.INVALID_MESSAGE,
        "node_id: Field required",
    ),
    (
        "v is 2",
        "text",
        json.dumps(register_msg("gpu-01", v=2)),
        CloseCode.UNSUPPORTED_VERSION,
        "version 2 is not supported",
    ),
    (
        "v is missing",
        "text",
        json.dumps({k: v for k, v in register_msg().items() if k != "v"}),
        CloseCode.UNSUPPORTED_VERSION,
        "version None",
    ),
    (
        "binary frame",
        "bytes",
        b'{"type": "heartbeat", "v": 1}',
        CloseCode.INVALID_MESSAGE,
        "binary",
    ),
    (
        "NUL in a string",
        "text",
        json.dumps(register_msg("gpu-01", hostname="gpu\x0001")),
        CloseCode.INVALID_MESSAGE,
        "U+0000",
    ),
]
BAD_IDS = [b[0] for b in BAD]


def closes(records) -> list[logging.LogRecord]:
    return [r for r in records if "agent socket closed" in r.getMessage()]


async def send_frame(comm, kind, frame) -> None:
    if kind == "bytes":
        await comm.send_to(bytes_data=frame)
    else:
        await comm.send_to(text_data=frame)


def assert_logged_once_without_errors(caplog, code):
    found = closes(caplog.records)
    assert len(found) == 1, [r.getMessage() for r in found]
    assert f"code={int(code)}" in found[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.fixture
async def credential():
    """An enrolled node, gpu-01, whose agent is not connected."""
    agent = await enrol("gpu-01")
    await agent.close()
    return agent.credential


# ---- named cases ---------------------------------------------------------------


@pytest.mark.parametrize("what, kind, frame, code, says", BAD, ids=BAD_IDS)
async def test_bad_frame(credential, caplog, what, kind, frame, code, says):
    # As the first frame: refused before anything is registered.
    comm = communicator(credential)
    assert (await comm.connect())[0]
    before = await db(snapshot)()
    caplog.clear()

    await send_frame(comm, kind, frame)
    got, reason = await expect_close(comm)

    assert (got, says in reason) == (code, True), reason
    assert_logged_once_without_errors(caplog, code)
    assert await db(snapshot)() == before

    # On a registered socket: the same refusal, and only the socket is gone.
    comm = communicator(credential)
    assert (await comm.connect())[0]
    await register(comm, "gpu-01")
    before = await db(snapshot)()
    caplog.clear()

    await send_frame(comm, kind, frame)
    got, reason = await expect_close(comm)

    assert (got, says in reason) == (code, True), reason
    assert_logged_once_without_errors(caplog, code)
    assert await db(snapshot)() == socket_closed(before)


def socket_closed(snap: dict) -> dict:
    """The snapshot as it should be once gpu-01's socket has closed: nothing else changes."""
    nodes = [
        {**n, "connected": False, "channel_name": ""} if n["id"] == "gpu-01" else n
        for n in snap["Node"]
    ]
    return {**snap, "Node": nodes}


@pytest.mark.parametrize(
    "msg",
    [
        heartbeat_msg(),
        {"type": "shard_status", "v": 1, "shard_id": "s1", "state": "ready"},
        {"type": "ack", "v": 1, "of": "desired", "version": 1},
        {"type": "logs_reply", "v": 1, "request_id": "r1"},
    ],
    ids=lambda m: m["type"],
)
async def test_anything_before_register_is_refused(credential, caplog, msg):
    comm = communicator(credential)
    assert (await comm.connect())[0]
    before = await db(snapshot)()
    caplog.clear()

    await comm.send_to(text_data=json.dumps(msg))
    code, reason = await expect_close(comm)

    assert code == CloseCode.NOT_REGISTERED
    assert f"'{msg['type']}' before 'register'" in reason
    assert_logged_once_without_errors(caplog, code)
    assert await db(snapshot)() == before


async def test_nothing_is_read_after_a_refusal(credential, caplog):
    # Frames already in flight behind the bad one must not be applied.
    comm = communicator(credential)
    assert (await comm.connect())[0]
    await register(comm, "gpu-01")
    before = await db(snapshot)()
    caplog.clear()

    await comm.send_to(text_data="{oops")
    await comm.send_to(text_data=json.dumps(heartbeat_msg(memory_total_mb=1)))
    code, _ = await expect_close(comm)

    assert code == CloseCode.INVALID_MESSAGE
    assert len(closes(caplog.records)) == 1
    assert await db(snapshot)() == socket_closed(before)


# ---- properties ----------------------------------------------------------------

PROPERTY_SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
frames = st.one_of(json_values.map(json.dumps), fuzzed_messages().map(json.dumps))


def expected_refusal(frame: str, first: bool) -> CloseCode | None:
    """The close code this frame must get, or None when it is valid and would be applied."""
    try:
        msg = protocol.parse_agent_message(frame)
    except ProtocolError as err:
        return err.code
    if first and msg.type != "register":
        return CloseCode.NOT_REGISTERED
    return None


@PROPERTY_SETTINGS
@given(frame=frames)
async def test_any_invalid_first_frame_closes_and_writes_nothing(credential, caplog, frame):
    code = expected_refusal(frame, first=True)
    assume(code is not None)
    comm = communicator(credential)
    assert (await comm.connect())[0]
    before = await db(snapshot)()
    seen = len(caplog.records)

    await comm.send_to(text_data=frame)
    got, _ = await expect_close(comm)

    assert got == code
    assert len(closes(caplog.records[seen:])) == 1
    assert await db(snapshot)() == before


@PROPERTY_SETTINGS
@given(frame=frames)
async def test_any_invalid_frame_on_a_live_socket_closes_and_writes_nothing(
    credential, caplog, frame
):
    code = expected_refusal(frame, first=False)
    assume(code is not None)
    comm = communicator(credential)
    assert (await comm.connect())[0]
    await register(comm, "gpu-01")
    before = await db(snapshot)()
    seen = len(caplog.records)

    await comm.send_to(text_data=frame)
    got, _ = await expect_close(comm)

    assert got == code
    assert len(closes(caplog.records[seen:])) == 1
    assert await db(snapshot)() == socket_closed(before)
