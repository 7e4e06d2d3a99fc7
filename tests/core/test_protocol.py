"""The wire schema on its own: no database, no socket.

Every message an agent can send either parses into a model or raises
ProtocolError with the close code the socket will use; nothing else escapes.
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentd import protocol
from agentd.protocol import CloseCode, ProtocolError
from tests.consumer.strategies import fuzzed_messages, json_values
from tests.factories import H100_GPUS, heartbeat_msg, register_msg

LOAD = {
    "cpu_percent": 12.5,
    "cpu_count": 64,
    "load1": 1.5,
    "load5": 1.0,
    "load15": 0.5,
    "memory_used_bytes": 10**9,
    "memory_available_bytes": 10**10,
}


def refused(raw) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        protocol.parse_agent_message(raw)
    return info.value


# ---- valid messages ------------------------------------------------------------


@pytest.mark.parametrize(
    "msg, kind",
    [
        (register_msg(), protocol.Register),
        (register_msg(memory_total_mb=None, gpus=[]), protocol.Register),
        (heartbeat_msg(), protocol.Heartbeat),
        (heartbeat_msg(load=LOAD, gpu_memory_used_mb=[1024] * 8), protocol.Heartbeat),
        (
            {"type": "shard_status", "v": 1, "shard_id": "s1", "state": "ready"},
            protocol.ShardStatus,
        ),
        (
            {"type": "fetch_progress", "v": 1, "shard_id": "s1", "bytes_done": 5},
            protocol.FetchProgress,
        ),
        ({"type": "logs_reply", "v": 1, "request_id": "r1", "lines": ["a"]}, protocol.LogsReply),
        ({"type": "ack", "v": 1, "of": "desired", "version": 4}, protocol.AgentAck),
        ({"type": "goodbye", "v": 1}, protocol.Goodbye),
    ],
)
def test_valid_messages_parse_from_text(msg, kind):
    parsed = protocol.parse_agent_message(json.dumps(msg))
    assert isinstance(parsed, kind)


def test_register_keeps_unknown_memory_unknown():
    reg = protocol.parse_agent_message(json.dumps(register_msg(memory_total_mb=None)))
    assert reg.memory_total_mb is None
    assert len(reg.gpus) == 8 and reg.gpus[3].pci_bus_id == H100_GPUS[3]["pci_bus_id"]


def test_fields_from_a_newer_agent_are_ignored():
    msg = heartbeat_msg(seq=3, something_new={"x": 1})
    assert protocol.parse_agent_message(json.dumps(msg)).seq == 3


def test_unknown_shard_state_parses_and_reads_as_failed():
    # Refusing it would cut the node off; reading it healthy would be worse.
    msg = protocol.parse_agent_message(
        json.dumps({"type": "shard_status", "v": 1, "shard_id": "s1", "state": "hibernating"})
    )
    assert protocol.shard_state_from_wire(msg.state) == protocol.ShardState.FAILED
    assert protocol.shard_state_from_wire("loading") == protocol.ShardState.LOADING


def test_control_messages_round_trip():
    desired = protocol.Desired(type="desired", version=7, shards=[])
    assert protocol.parse_control_message(protocol.dump(desired)) == desired
    ack = protocol.ServerAck(type="ack", of="register", node_id="gpu-01", credential="lgn_x")
    assert protocol.parse_control_message(protocol.dump(ack)).credential == "lgn_x"
    closing = protocol.Closing(type="closing", code=CloseCode.FORBIDDEN, reason="not yours")
    assert protocol.parse_control_message(protocol.dump(closing)) == closing


# ---- the multi-node fields: optional both ways -------------------------------------

DESIRED_SHARD = {
    "shard_id": "s1",
    "replica_id": "r1",
    "model": "llama-405b",
    "state": "running",
    "rank": 1,
    "nnodes": 2,
    "leader_addr": "10.0.0.7",
    "leader_port": 29500,
    "hcas": ["mlx5_0"],
    "profile": {"name": "default", "engine": "vllm"},
}


def test_a_desired_set_from_an_older_control_plane_parses_without_them():
    raw = {"type": "desired", "v": 1, "version": 3, "shards": [DESIRED_SHARD]}
    [shard] = protocol.parse_control_message(json.dumps(raw)).shards
    assert (shard.mgmt_interface, shard.fabric) == ("", "")


def test_a_desired_set_carries_the_interface_and_the_fabric():
    entry = {**DESIRED_SHARD, "mgmt_interface": "eno1", "fabric": "ib0"}
    desired = protocol.parse_control_message(
        json.dumps({"type": "desired", "v": 1, "version": 3, "shards": [entry]})
    )
    assert (desired.shards[0].mgmt_interface, desired.shards[0].fabric) == ("eno1", "ib0")
    assert protocol.parse_control_message(protocol.dump(desired)) == desired
    # and an older agent's schema, which knows neither, ignores them (extra="ignore")
    older = protocol.DesiredShard.model_validate({**entry, "a_field_from_the_future": 1})
    assert older.shard_id == "s1"


def test_register_may_name_the_management_interface_or_not():
    assert protocol.parse_agent_message(json.dumps(register_msg())).mgmt_interface == ""
    reg = protocol.parse_agent_message(json.dumps(register_msg(mgmt_interface="eno1")))
    assert reg.mgmt_interface == "eno1"


@pytest.mark.parametrize("name", ["eth0 ; rm -rf /", "a" * 16, "eno1\n", "eth/0"])
def test_an_interface_that_is_no_interface_name_is_refused(name):
    assert refused(json.dumps(register_msg(mgmt_interface=name))).code == CloseCode.INVALID_MESSAGE


# ---- refused messages ----------------------------------------------------------

BIG = 2**63


@pytest.mark.parametrize(
    "raw, code, says",
    [
        ("{not json", CloseCode.INVALID_MESSAGE, "not JSON"),
        (b"\xff\xfe", CloseCode.INVALID_MESSAGE, "not JSON"),
        ("[1, 2]", CloseCode.INVALID_MESSAGE, "must be a JSON object"),
        ('"register"', CloseCode.INVALID_MESSAGE, "must be a JSON object"),
        ("null", CloseCode.INVALID_MESSAGE, "must be a JSON object"),
        ('{"v": 1}', CloseCode.INVALID_MESSAGE, "unknown message type None"),
        ('{"type": "reboot", "v": 1}', CloseCode.INVALID_MESSAGE, "unknown message type 'reboot'"),
        ('{"type": 7, "v": 1}', CloseCode.INVALID_MESSAGE, "unknown message type 7"),
        # A control-plane message type sent by an agent is still unknown to this end.
        ('{"type": "desired", "v": 1}', CloseCode.INVALID_MESSAGE, "unknown message type"),
        ('{"type": "heartbeat"}', CloseCode.UNSUPPORTED_VERSION, "version None"),
        ('{"type": "heartbeat", "v": 2}', CloseCode.UNSUPPORTED_VERSION, "version 2"),
        ('{"type": "heartbeat", "v": "1"}', CloseCode.UNSUPPORTED_VERSION, "version '1'"),
        ('{"type": "heartbeat", "v": true}', CloseCode.UNSUPPORTED_VERSION, "version True"),
        ('{"type": "heartbeat", "v": 1.0}', CloseCode.UNSUPPORTED_VERSION, "version 1.0"),
        ('{"type": "register", "v": 1}', CloseCode.INVALID_MESSAGE, "register: node_id: Field"),
        (
            '{"type": "register", "v": 1, "node_id": "../etc"}',
            CloseCode.INVALID_MESSAGE,
            "register: node_id: String should match",
        ),
        (
            '{"type": "register", "v": 1, "node_id": 17}',
            CloseCode.INVALID_MESSAGE,
            "register: node_id: Input should be a valid string",
        ),
        # Strict types: a number in a string or a number for a flag is a bug in the sender.
        ('{"type": "heartbeat", "v": 1, "seq": "3"}', CloseCode.INVALID_MESSAGE, "seq"),
        ('{"type": "heartbeat", "v": 1, "seq": 1.5}', CloseCode.INVALID_MESSAGE, "seq"),
        ('{"type": "heartbeat", "v": 1, "seq": -1}', CloseCode.INVALID_MESSAGE, "seq"),
        (
            '{"type": "heartbeat", "v": 1, "weights_changed": 1}',
            CloseCode.INVALID_MESSAGE,
            "weights_changed",
        ),
        ('{"type": "heartbeat", "v": 1, "storage": {}}', CloseCode.INVALID_MESSAGE, "storage"),
        ('{"type": "ack", "v": 1, "of": "everything"}', CloseCode.INVALID_MESSAGE, "ack: of"),
        # Not JSON, though Python's json module would take them.
        (
            '{"type": "heartbeat", "v": 1, "load": {"cpu_percent": NaN}}',
            CloseCode.INVALID_MESSAGE,
            "NaN is not a JSON value",
        ),
        ("[" * 100_000 + "]" * 100_000, CloseCode.INVALID_MESSAGE, "nested too deeply"),
    ],
)
def test_refused_with_code_and_reason(raw, code, says):
    err = refused(raw)
    assert err.code == code
    assert says in err.reason


@pytest.mark.parametrize(
    "msg, says",
    [
        # Each would pass a lax schema and then fail in the database.
        (register_msg(memory_total_mb=BIG), "memory_total_mb"),
        (register_msg(gpus=[{**H100_GPUS[0], "memory_total_mb": 2**31}]), "gpus.0.memory_total_mb"),
        (register_msg(gpus=[{**H100_GPUS[0], "index": 40000}]), "gpus.0.index"),
        (register_msg(gpus=[H100_GPUS[0], H100_GPUS[0]]), "GPU index 0 appears more than once"),
        (
            register_msg(provision=[{"engine": "vllm", "state": "ok"}] * 2),
            "engine 'vllm' appears more than once",
        ),
        (register_msg(hostname="gpu\x0001"), "a string contains U+0000"),
        (register_msg(labels={"a\x00": "b"}), "a string contains U+0000"),
        (heartbeat_msg(gpu_memory_used_mb=[2**31]), "gpu_memory_used_mb.0"),
        (heartbeat_msg(load={**LOAD, "cpu_percent": 101}), "load.cpu_percent"),
        (
            heartbeat_msg(
                load={**LOAD, "shards": [{"shard_id": "s", "cpu_cores": 1, "rss_bytes": 1}] * 2}
            ),
            "shard 's' appears more than once",
        ),
        (
            {
                "type": "shard_status",
                "v": 1,
                "shard_id": "s1",
                "state": "failed",
                "exit_code": 2**40,
            },
            "exit_code",
        ),
    ],
)
def test_values_the_database_cannot_hold_are_refused(msg, says):
    err = refused(json.dumps(msg))
    assert err.code == CloseCode.INVALID_MESSAGE
    assert says in err.reason


def test_lone_surrogate_is_refused():
    err = refused('{"type": "register", "v": 1, "node_id": "a", "hostname": "\\ud800"}')
    assert err.code == CloseCode.INVALID_MESSAGE and "hostname" in err.reason


def test_reason_is_short_even_for_a_huge_type():
    err = refused(json.dumps({"type": "x" * 100_000, "v": 1}))
    assert len(err.reason) < 100


def test_many_errors_are_summarised_in_one_reason():
    err = refused(json.dumps({"type": "register", "v": 1, "node_id": 1, "hostname": 2}))
    assert "(and 1 more)" in err.reason


# ---- properties ----------------------------------------------------------------


def _outcome(raw):
    try:
        return protocol.parse_agent_message(raw)
    except ProtocolError as err:
        assert err.code in set(CloseCode)
        assert err.reason
        return err


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_any_json_value_parses_or_is_a_protocol_error(value):
    _outcome(json.dumps(value))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(fuzzed_messages())
def test_fuzzed_fields_parse_or_are_a_protocol_error(msg):
    result = _outcome(json.dumps(msg))
    if not isinstance(result, ProtocolError):
        # Whatever parsed must survive the trip back to JSON unchanged in meaning.
        assert protocol.parse_agent_message(protocol.dump(result)) == result


@settings(max_examples=100)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_parse_or_are_a_protocol_error(raw):
    _outcome(raw)
