"""Hypothesis strategies for agent messages: fuzzed ones, and valid ones at the schema's edges."""

from hypothesis import strategies as st

from agentd import protocol
from tests.factories import heartbeat_msg, register_msg

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)

MESSAGE_FIELDS = {
    kind: sorted(set(model.model_fields) - {"type", "v"})
    for kind, model in {
        "register": protocol.Register,
        "heartbeat": protocol.Heartbeat,
        "shard_status": protocol.ShardStatus,
        "fetch_progress": protocol.FetchProgress,
        "logs_reply": protocol.LogsReply,
        "ack": protocol.AgentAck,
        "goodbye": protocol.Goodbye,
    }.items()
}


@st.composite
def fuzzed_messages(draw):
    """A known type and version with some of its real fields set to arbitrary JSON values."""
    kind = draw(st.sampled_from(sorted(MESSAGE_FIELDS)))
    base = {"register": register_msg(), "heartbeat": heartbeat_msg()}.get(
        kind, {"type": kind, "v": 1}
    )
    names = MESSAGE_FIELDS[kind]
    fuzzed = draw(st.dictionaries(st.sampled_from(names), json_values, max_size=4))
    return {**base, **fuzzed}


# Valid messages, pushed to the edges of the schema: the longest strings (in
# two-byte characters), the largest integers, floats up to the largest double.
# Everything the schema takes must also fit the database.

_chars = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))


def _text(max_size: int, min_size: int = 0):
    return st.text(_chars, min_size=min_size, max_size=min(max_size, 12)) | st.just("é" * max_size)


def _int(lo: int, hi: int):
    return st.integers(lo, hi) | st.sampled_from([lo, hi])


INT64, INT32, INT16 = _int(0, 2**63 - 1), _int(0, 2**31 - 1), _int(0, 32767)
VERSION = _int(0, 2**62)  # desired-set versions leave room to number past them
_float = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
_shard_ids = st.from_regex(protocol.SHARD_ID_PATTERN, fullmatch=True) | st.just("s-1")


def _lists(elements, max_size=3, **kw):
    return st.lists(elements, max_size=max_size, **kw)


_storage = st.fixed_dictionaries(
    {"path": _text(1024, 1), "free_bytes": INT64, "total_bytes": INT64},
    optional={"shared": st.booleans()},
)
_weights = st.fixed_dictionaries(
    {"path": _text(1024, 1), "size_bytes": INT64}, optional={"shared": st.booleans()}
)
_install = st.fixed_dictionaries(
    {"engine": _text(32, 1), "state": _text(32)},
    optional={"version": _text(255), "variant": _text(255), "detail": _text(4096)},
)
_installs = _lists(_install, unique_by=lambda e: e["engine"])
_versions = st.dictionaries(_text(255), _text(255), max_size=3)
_load = st.fixed_dictionaries(
    {
        "cpu_percent": st.floats(0, 100),
        "cpu_count": _int(1, 2**31 - 1),
        "load1": _float,
        "load5": _float,
        "load15": _float,
        "memory_used_bytes": INT64,
        "memory_available_bytes": INT64,
    },
    optional={
        "shards": _lists(
            st.fixed_dictionaries(
                {"shard_id": _shard_ids, "cpu_cores": _float, "rss_bytes": INT64}
            ),
            unique_by=lambda s: s["shard_id"],
        )
    },
)
valid_heartbeats = st.fixed_dictionaries(
    {"type": st.just("heartbeat"), "v": st.just(1)},
    optional={
        "seq": INT64,
        "gpu_memory_used_mb": _lists(INT32, max_size=9),
        "new_problems": _lists(
            st.fixed_dictionaries(
                {"problem": _text(255)}, optional={"gpu_index": st.none() | INT16}
            )
        ),
        "storage": _lists(_storage),
        "weights_changed": st.booleans(),
        "weights": _lists(_weights),
        "memory_total_mb": st.none() | INT64,
        "engines_changed": st.booleans(),
        "engine_versions": _versions,
        "provision_changed": st.booleans(),
        "provision": _installs,
        "load": st.none() | _load,
        "desired_version": VERSION,
    },
)
_gpu = st.fixed_dictionaries(
    {"index": INT16, "uuid": _text(96, 1)},
    optional={
        "name": _text(255),
        "memory_total_mb": INT32,
        "memory_used_mb": INT32,
        "compute_capability": _text(16),
        "numa_node": st.none() | _int(-(2**31), 2**31 - 1),
        "pci_bus_id": _text(32),
        "driver_version": _text(32),
        "cuda_version": _text(16),
        "nvlink_peers": _lists(INT16),
        "ecc_errors": INT32,
        "temperature_c": st.none() | _int(-(2**31), 2**31 - 1),
        "problems": _lists(_text(255)),
    },
)
_running = st.fixed_dictionaries(
    {"shard_id": _shard_ids, "state": _text(32)},
    optional={
        "replica_id": _text(255),
        "rank": INT16,
        "gpu_uuids": _lists(_text(255)),
        "port": _int(0, 65535),
        "model": _text(255),
        "pid": st.none() | _int(-(2**31), 2**31 - 1),
    },
)
valid_registers = st.fixed_dictionaries(
    {"type": st.just("register"), "v": st.just(1), "node_id": st.just("gpu-01")},
    optional={
        "hostname": _text(255),
        # An IP literal (the schema refuses names) the control plane accepts.
        "mgmt_addr": st.sampled_from(["", "10.0.0.7", "192.0.2.1", "2001:db8::7"]),
        "labels": st.dictionaries(_text(63), _text(255), max_size=3),
        "agent_version": _text(64),
        "engine_versions": _versions,
        "memory_total_mb": st.none() | INT64,
        "gpus": _lists(_gpu, unique_by=lambda g: g["index"]),
        "fabrics": _lists(
            st.fixed_dictionaries(
                {"fabric": _text(64, 1)},
                optional={"hcas": _lists(_text(64)), "rate_gbps": INT32},
            )
        ),
        "storage": _lists(_storage),
        "weights": _lists(_weights),
        "provision": _installs,
        "running_shards": _lists(_running),
        "desired_version": VERSION,
    },
)
valid_shard_reports = st.fixed_dictionaries(
    {
        "type": st.just("shard_status"),
        "v": st.just(1),
        "shard_id": _shard_ids,
        "state": _text(32, 1),
    },
    optional={
        "replica_id": _text(255),
        "error": _text(4096),
        "exit_code": st.none() | _int(-(2**31), 2**31 - 1),
        "last_output": _lists(_text(4096)),
    },
) | st.fixed_dictionaries(
    {
        "type": st.just("fetch_progress"),
        "v": st.just(1),
        "shard_id": _shard_ids,
        "bytes_done": INT64,
    },
    optional={"source": _text(1024), "bytes_total": st.none() | INT64},
)
