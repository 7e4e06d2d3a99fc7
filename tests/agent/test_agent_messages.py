"""The agent's side of each message: heartbeat semantics, fencing, logs, weight removal."""

import asyncio
import os
from pathlib import Path

import pytest

from agentd import logs, nvml, protocol
from agentd.agent import Agent
from agentd.config import parse_config
from agentd.discovery import Machine
from agentd.supervised import NoShards
from tests.agent import nvml_data


class RecordingShards(NoShards):
    """The supervisor's interface, recording what the agent asks of it."""

    def __init__(self, paths_in_use=(), tails=None):
        self.applied: list[int] = []
        self._paths = list(paths_in_use)
        self._tails = tails or {}
        self.gate: asyncio.Event | None = None

    async def apply(self, desired):
        if self.gate is not None:
            await self.gate.wait()
        self.applied.append(desired.version)

    def paths_in_use(self):
        return self._paths

    def sources(self):
        return sorted(self._tails)

    def tail(self, shard_id, lines):
        found = self._tails.get(shard_id)
        return None if found is None else found[-lines:]


def make_agent(tmp_path, shards=None, **fields) -> Agent:
    weights = tmp_path / "weights"
    weights.mkdir(exist_ok=True)
    cfg = parse_config(
        {
            "control_plane_url": "ws://cp.test/ws/agent/",
            "join_token": "jt_test",
            "node_id": "gpu-t1",
            "state_dir": str(tmp_path / "state"),
            "weights_dirs": [str(weights)],
            **fields,
        }
    )
    meminfo = tmp_path / "meminfo"
    if not meminfo.exists():
        meminfo.write_text("MemTotal:       2113024000 kB\n")
    machine = Machine(
        state_dir=cfg.state_dir,
        weights_dirs=list(cfg.weights_dirs),
        meminfo=meminfo,
        mounts_file=tmp_path / "no-mounts",
        infiniband=tmp_path / "no-ib",
    )
    (tmp_path / "state").mkdir(exist_ok=True)
    return Agent(cfg, shards=shards or RecordingShards(), machine=machine)


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    path = nvml_data.write(tmp_path / "nvml.json", nvml_data.hgx(count=2))
    monkeypatch.setenv(nvml.FAKE_ENV, str(path))
    return path


def _rewrite(path: Path, spec: dict) -> None:
    nvml_data.write(path, spec)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


# ---- heartbeats --------------------------------------------------------------


def test_heartbeats_carry_only_news_after_a_register(tmp_path, gpus):
    agent = make_agent(tmp_path)
    reg = agent.register_message(mgmt_addr="10.0.0.7")
    assert reg.memory_total_mb == 2063500 and len(reg.gpus) == 2 and reg.mgmt_addr == "10.0.0.7"

    hb = agent.heartbeat_message()
    assert hb.seq == 1
    assert [s.path for s in hb.storage] == [str(tmp_path / "state"), str(tmp_path / "weights")]
    assert hb.gpu_memory_used_mb == [535, 535]
    assert hb.load is not None and hb.load.cpu_count >= 1
    # what register said already is not news
    assert not hb.weights_changed and hb.weights == []
    assert hb.memory_total_mb is None and not hb.engines_changed and hb.new_problems == []

    # weights appear: reported once, with the flag
    (tmp_path / "weights" / "m.gguf").write_bytes(b"w" * 100)
    agent.weights_rescan_s = 0
    hb = agent.heartbeat_message()
    assert hb.weights_changed and [(Path(w.path).name, w.size_bytes) for w in hb.weights] == [
        ("m.gguf", 100)
    ]
    assert not agent.heartbeat_message().weights_changed

    # memory added to the VM: said once
    (tmp_path / "meminfo").write_text("MemTotal:       4226048000 kB\n")
    assert agent.heartbeat_message().memory_total_mb == 4127000
    assert agent.heartbeat_message().memory_total_mb is None


def test_a_new_gpu_problem_is_reported_once(tmp_path, gpus):
    spec = nvml_data.hgx(count=2)
    spec["gpus"][0]["ecc_volatile_uncorrected"] = 1  # known at registration
    _rewrite(gpus, spec)
    agent = make_agent(tmp_path)
    reg = agent.register_message()
    assert reg.gpus[0].problems == ["uncorrected ECC errors over 0"]
    assert agent.heartbeat_message().new_problems == []

    spec["gpus"][1]["remapped_rows"] = [0, 1, 1, 0]
    _rewrite(gpus, spec)
    hb = agent.heartbeat_message()
    assert [(p.gpu_index, p.problem) for p in hb.new_problems] == [
        (1, "row remapping pending: reset the GPU")
    ]
    assert agent.heartbeat_message().new_problems == []


def test_a_cpu_node_heartbeats_without_gpu_fields(tmp_path, monkeypatch):
    monkeypatch.delenv(nvml.FAKE_ENV, raising=False)
    agent = make_agent(tmp_path)
    assert agent.register_message().gpus == []
    hb = agent.heartbeat_message()
    assert hb.gpu_memory_used_mb == [] and hb.load.memory_available_bytes > 0


# ---- desired sets: fencing -----------------------------------------------------


def _desired(version, n=0):
    shards = [
        protocol.DesiredShard(
            shard_id=f"s{i}",
            replica_id="r1",
            model="m",
            state="running",
            profile=protocol.ProfileSpec(name="p", engine="llamacpp"),
        )
        for i in range(n)
    ]
    return protocol.Desired(type="desired", version=version, shards=shards)


def _acks(agent):
    """The desired acks a socket would send now, taken off the outbox as it would."""
    out = []
    while agent.outbox:
        key, m = agent.outbox.first()
        if m.type == "ack" and m.of == "desired":
            out.append((m.version, m.ok))
        agent.outbox.sent(key, m)
    return out


async def test_desired_converges_to_the_newest_and_ignores_older(tmp_path):
    shards = RecordingShards()
    agent = make_agent(tmp_path, shards=shards)
    await agent.start()
    try:
        await agent.handle(_desired(3, n=1))
        await _settle()
        assert shards.applied == [3] and _acks(agent) == [(3, True)]

        await agent.handle(_desired(2, n=5))  # a late arrival: fenced off
        await _settle()
        assert shards.applied == [3] and _acks(agent) == []

        await agent.handle(_desired(3, n=1))  # a repeat: acked again, nothing redone
        await _settle()
        assert shards.applied == [3] and _acks(agent) == [(3, True)]

        # two versions while the supervisor is busy: only the newest is applied
        shards.gate = asyncio.Event()
        await agent.handle(_desired(4))
        await _settle()
        await agent.handle(_desired(6))
        await agent.handle(_desired(5))
        shards.gate.set()
        await _settle()
        assert shards.applied == [3, 4, 6]
        # unsent, the ack of 6 supersedes the ack of 4
        assert _acks(agent) == [(6, True)]
    finally:
        await agent.close()

    # the version survives a restart of the agent and goes with its register
    again = make_agent(tmp_path)
    assert again.desired_version == 6
    assert again.register_message().desired_version == 6


async def _settle():
    for _ in range(20):
        await asyncio.sleep(0)


# ---- logs ------------------------------------------------------------------------


def test_logs_reply_tails_the_agent_log_and_lists_sources(tmp_path):
    shards = RecordingShards(tails={"shard-a": [f"engine line {i}" for i in range(50)]})
    agent = make_agent(tmp_path, shards=shards)
    agent.cfg.log_path.write_text("".join(f"agent line {i}\n" for i in range(1000)))

    reply = agent.logs_reply(protocol.LogsRequest(type="logs_request", request_id="q1", lines=3))
    assert reply.lines == ["agent line 997", "agent line 998", "agent line 999"]
    assert reply.sources == ["agent", "shard-a"] and reply.error == ""

    reply = agent.logs_reply(
        protocol.LogsRequest(type="logs_request", request_id="q2", source="shard-a", lines=2)
    )
    assert reply.lines == ["engine line 48", "engine line 49"]

    reply = agent.logs_reply(
        protocol.LogsRequest(type="logs_request", request_id="q3", source="nope")
    )
    assert reply.error == "no log source 'nope' on this node" and reply.lines == []


def test_a_huge_log_reply_still_fits_one_websocket_message(tmp_path):
    agent = make_agent(tmp_path)
    agent.cfg.log_path.write_text(("x" * 5000 + "\n") * 3000)
    reply = agent.logs_reply(
        protocol.LogsRequest(type="logs_request", request_id="big", lines=10000)
    )
    assert len(protocol.dump(reply).encode()) < 2**20
    assert 100 < len(reply.lines) < 3000  # the newest lines, as many as fit
    assert all(len(line) == logs.MAX_LINE_CHARS for line in reply.lines)


def test_tail_reads_across_chunk_boundaries(tmp_path):
    p = tmp_path / "log"
    p.write_text("".join(f"{i:05d}\n" for i in range(5000)))
    assert logs.tail(p, 4000, chunk=100) == [f"{i:05d}" for i in range(1000, 5000)]
    assert logs.tail(p, 10, chunk=7) == [f"{i:05d}" for i in range(4990, 5000)]


# ---- remove_weights -------------------------------------------------------------


def test_remove_weights_checks_every_path_again(tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    w = tmp_path / "weights"
    w.mkdir()
    (w / "old-model").mkdir()
    (w / "old-model" / "a.safetensors").write_bytes(b"1" * 10)
    (w / "serving").mkdir()
    (w / "stale.gguf").write_bytes(b"2")
    os.symlink(outside, w / "link-to-elsewhere")
    shards = RecordingShards(paths_in_use=[str(w / "serving")])
    agent = make_agent(tmp_path, shards=shards)

    detail, ok = agent.remove_weights(
        [
            str(w / "old-model"),
            str(w / "stale.gguf"),
            str(w / "serving"),
            str(outside),
            str(w / ".." / "precious"),
            str(w),
            str(w / "link-to-elsewhere"),
            str(w / "already-gone"),
        ]
    )

    assert not ok
    assert not (w / "old-model").exists() and not (w / "stale.gguf").exists()
    assert (w / "serving").is_dir()
    assert (outside / "keep.txt").read_text() == "mine"  # the link went, not what it names
    assert not os.path.lexists(w / "link-to-elsewhere")
    assert w.is_dir()
    assert detail.startswith("removed 4; kept ")
    assert f"{w / 'serving'}: in use by a shard here" in detail
    assert f"{outside}: not inside a weights dir" in detail
    assert f"{w}: not inside a weights dir" in detail


def test_an_agents_own_port_range_reaches_the_control_plane_unless_a_label_says_otherwise(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(nvml.FAKE_ENV, raising=False)
    # Two agents on one machine: the second's engines must listen elsewhere, and the
    # control plane, which picks each shard's port, must know it.
    second = make_agent(tmp_path, engine_port_range=[31000, 31999])
    assert second.register_message().labels["llmgw.io/ports"] == "31000-31999"
    # An operator's label wins; the default range adds none (the fleet's setting stands).
    told = make_agent(
        tmp_path, engine_port_range=[31000, 31999], labels={"llmgw.io/ports": "32000-32099"}
    )
    assert told.register_message().labels["llmgw.io/ports"] == "32000-32099"
    assert "llmgw.io/ports" not in make_agent(tmp_path).register_message().labels
