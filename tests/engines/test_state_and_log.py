"""The state file survives damage; a shard's log keeps recent lines, whole, and rotates."""

import json
import os

from agentd import shardlog, state
from agentd.shard import Shard, parse_spec
from agentd.shardlog import ShardLog, tail_file
from tests.engines.helpers import Recorder, fake_supervisor, shard


def test_state_file_round_trip_is_atomic(tmp_path):
    rec = state.ShardRecord(shard_id="r1-s0", engine="vllm", port=8001, state="ready", pid=42)
    state.save(tmp_path, 7, {"r1-s0": rec})
    assert state.load(tmp_path) == (7, {"r1-s0": rec})
    # no temporary file is left behind
    assert [p.name for p in tmp_path.iterdir()] == [state.STATE_FILE]


def test_an_adopted_shard_keeps_its_interface_and_fabric(tmp_path):
    # given a multi-node shard as the desired set gave it
    spec = shard(nnodes=2, rank=1, hcas=["mlx5_0"], mgmt_interface="eno1", fabric="ib0")
    sh = Shard("r1-s0", tmp_path / "r1-s0.log")
    sh.spec = sh.want = spec
    state.save(tmp_path, 4, {"r1-s0": sh.record()})

    # when the next agent reads the state file
    _, records = state.load(tmp_path)
    again = Shard("r1-s0", tmp_path / "r1-s0.log")
    again.restore(records["r1-s0"])

    # then it runs the same spec: nothing to restart, NCCL's interface the same
    assert again.spec == spec
    # and so does one that finds the engine by its mark alone (state file gone)
    marks = state.marks(tmp_path, "r1-s0", "vllm", 8001, spec.model_dump_json())
    assert parse_spec(marks[state.MARK_SPEC]) == spec


def test_a_state_file_from_before_the_fields_still_reads(tmp_path):
    old = shard().model_dump(mode="json")
    del old["mgmt_interface"], old["fabric"]
    assert parse_spec(old) == shard()


async def test_a_damaged_state_file_is_ignored_not_fatal(state_dir):
    (state_dir / state.STATE_FILE).write_text('{"desired_version": 3, "shards": [{"shard')
    sup = fake_supervisor(state_dir, Recorder())
    await sup.start()
    try:
        assert sup.desired_version == 0
        assert sup.running_shards() == []
        # and the next write replaces it with a good one
        assert json.loads((state_dir / state.STATE_FILE).read_text())["desired_version"] == 0
    finally:
        await sup.close()


def test_log_keeps_whole_lines_and_strips_what_the_protocol_refuses(tmp_path):
    path = tmp_path / "s.log"
    log = ShardLog(path)
    with open(path, "ab") as fh:
        fh.write(b"loading weights\nhalf a li")
    log.read_new()
    assert list(log.ring) == ["loading weights"]
    with open(path, "ab") as fh:
        fh.write(b"ne\nnul\x00here " + b"x" * 5000 + b"\n")
    log.read_new()
    assert log.ring[-2] == "half a line"
    last = log.recent(1)[0]
    assert "\x00" not in last and len(last) == 4096


def test_log_rotates_when_too_big_and_the_engine_keeps_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(shardlog, "MAX_LOG_BYTES", 1000)
    path = tmp_path / "s.log"
    log = ShardLog(path)
    # the engine's own file descriptor, in append mode as the supervisor opens it
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b"".join(b"line %04d\n" % i for i in range(200)))
    log.read_new()
    assert path.stat().st_size == 0
    assert tail_file(path.with_suffix(".log.1"), 1) == ["line 0199"]
    os.write(fd, b"after rotation\n")
    os.close(fd)
    log.read_new()
    assert log.ring[-1] == "after rotation"
    assert tail_file(path, 5) == ["after rotation"]
