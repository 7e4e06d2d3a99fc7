"""The supervisor with real processes: the fake engine's slow load, crash and hang; bad input."""

import asyncio
import os
import signal
import socket

import pytest

from agentd import protocol, state
from agentd.engines.base import http_get
from tests.engines.helpers import (
    Recorder,
    adapters_reported,
    desired,
    fake_supervisor,
    profile,
    shard,
)
from tests.processes import pid_alive

pytestmark = pytest.mark.live


async def started(state_dir, *specs, version=1, **kwargs):
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, **kwargs)
    await sup.start()
    assert await sup.apply(desired(version, *specs))
    return sup, rec


async def test_slow_load_stays_loading_then_becomes_ready(state_dir):
    sup, rec = await started(state_dir, shard(args=["--load-time", "1.5"]))
    try:
        await rec.wait_for("r1-s0", "loading")
        # given the engine is still loading, then the shard says so and nothing routes to it
        (running,) = sup.running_shards()
        assert running.state == "loading"
        status, _ = await http_get("127.0.0.1", running.port, "/health", 2)
        assert status == 503
        await rec.wait_for("r1-s0", "ready")
        assert rec.states("r1-s0") == ["pending", "starting", "loading", "ready"]
        status, body = await http_get("127.0.0.1", running.port, "/v1/models", 2)
        assert status == 200 and b"tiny-llama" in body
        assert sup.paths_in_use() == []  # no model path: nothing on disk to keep
    finally:
        await sup.close()


async def test_crash_is_failed_with_exit_code_and_last_output(state_dir):
    spec = shard(args=["--crash-after", "0.8", "--exit-code", "7"])
    sup, rec = await started(state_dir, spec)
    try:
        failed = await rec.wait_for("r1-s0", "failed")
        assert failed.exit_code == 7
        assert failed.error == "the engine exited with code 7"
        assert "fake engine: crashing with exit code 7" in failed.last_output
        # The same spec again is not a restart: restarts are the control plane's call.
        assert await sup.apply(desired(2, spec))
        await asyncio.sleep(0.5)
        assert rec.states("r1-s0")[-1] == "failed"
        assert sup.running_shards()[0].pid is None
    finally:
        await sup.close()


async def test_hang_times_out_and_the_whole_group_is_killed(state_dir):
    # The deadline leaves the fake engine time to start ignoring SIGTERM on a machine whose
    # cores are busy (CI's two): at 1.5 s, one still importing took the SIGTERM and died of it.
    spec = shard(args=["--hang", "--spawn-worker"], startup_timeout_s=4)
    sup, rec = await started(state_dir, spec, stop_grace_s=0.5)
    try:
        await rec.wait_for("r1-s0", "starting")
        pid = sup.process_groups()["r1-s0"]
        failed = await rec.wait_for("r1-s0", "failed")
        assert failed.error == "the engine did not become ready within 4 s"
        # It ignores SIGTERM, so it took a SIGKILL, and its worker went with it.
        assert failed.exit_code == -signal.SIGKILL
        worker = next(ln for ln in failed.last_output if "worker pid" in ln)
        worker_pid = int(worker.rsplit(" ", 1)[1])
        assert not pid_alive(pid)
        assert not pid_alive(worker_pid)
    finally:
        await sup.close()


async def test_killed_engine_is_failed_with_signal_and_output(state_dir):
    sup, rec = await started(state_dir, shard())
    try:
        await rec.wait_for("r1-s0", "ready")
        os.kill(sup.process_groups()["r1-s0"], signal.SIGKILL)
        failed = await rec.wait_for("r1-s0", "failed")
        assert failed.exit_code == -signal.SIGKILL
        assert failed.error == "the engine was killed by SIGKILL"
        assert any("ready, serving tiny-llama" in ln for ln in failed.last_output)
        assert sup.process_groups() == {}
    finally:
        await sup.close()


async def test_older_desired_version_is_ignored(state_dir):
    sup, rec = await started(state_dir, shard("a-s0"), version=5)
    try:
        await rec.wait_for("a-s0", "ready")
        # when an older set arrives late, then nothing changes
        assert not await sup.apply(desired(4, shard("b-s0")))
        await asyncio.sleep(0.3)
        assert sup.desired_version == 5
        assert [s.shard_id for s in sup.running_shards()] == ["a-s0"]
        assert rec.states("b-s0") == []
        assert rec.states("a-s0")[-1] == "ready"
    finally:
        await sup.close()


@pytest.mark.parametrize(
    "kwargs, engine, reason",
    [
        (dict(disabled=["fake"]), "fake", "engine fake is disabled on this node"),
        (dict(binaries={}), "fake", "engine 'fake' is not available here"),
        (
            dict(binaries={"vllm": "/opt/nowhere/vllm"}),
            "vllm",
            "/opt/nowhere/vllm is not installed",
        ),
    ],
    ids=["disabled", "not configured", "binary missing"],
)
async def test_missing_or_disabled_engine_fails_the_shard(state_dir, kwargs, engine, reason):
    sup, rec = await started(state_dir, shard(engine=engine), **kwargs)
    try:
        failed = await rec.wait_for("r1-s0", "failed")
        assert reason in failed.error
        assert rec.states("r1-s0") == ["pending", "failed"]
        assert engine not in sup.engine_versions()
    finally:
        await sup.close()


async def test_busy_port_is_never_shared(state_dir):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        sup, rec = await started(state_dir, shard(port=port))
        try:
            failed = await rec.wait_for("r1-s0", "failed")
            assert failed.error.startswith(f"port {port} is already in use by another process")
            assert sup.process_groups() == {}
        finally:
            await sup.close()


async def test_two_shards_on_one_port_second_fails(state_dir):
    sup, rec = await started(state_dir, shard("a-s0"))
    try:
        await rec.wait_for("a-s0", "ready")
        port = sup.running_shards()[0].port
        await sup.apply(desired(2, shard("a-s0"), shard("b-s0", port=port)))
        failed = await rec.wait_for("b-s0", "failed")
        assert failed.error == f"port {port} is already in use by shard a-s0"
    finally:
        await sup.close()


async def test_stop_kills_the_group_and_forgets_absent_shards(state_dir):
    sup, rec = await started(state_dir, shard(args=["--spawn-worker"]))
    try:
        await rec.wait_for("r1-s0", "ready")
        pid = sup.process_groups()["r1-s0"]
        await sup.apply(desired(2, shard(state="stopped")))
        await rec.wait_for("r1-s0", "stopped")
        assert not pid_alive(pid)
        assert state.find_marked(state_dir) == {}  # the worker too
        await sup.apply(desired(3))
        await asyncio.sleep(0.3)
        assert sup.running_shards() == []
        assert sup.log_sources() == []
    finally:
        await sup.close()


async def _stream(port: int, tokens: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": %d}'
    body %= tokens
    writer.write(
        b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


async def _drained_mid_answer(state_dir) -> asyncio.Task:
    """A fake engine drained while a 12-token stream (about 1.7 s) runs; once it
    stopped, that stream's task."""
    sup, rec = await started(state_dir, shard(args=["--token-delay", "0.15"]))
    try:
        await rec.wait_for("r1-s0", "ready")
        port = sup.running_shards()[0].port
        request = asyncio.create_task(_stream(port, 12))
        await asyncio.sleep(0.3)
        await sup.apply(desired(2, shard(state="draining", args=["--token-delay", "0.15"])))
        await rec.wait_for("r1-s0", "draining")
        await rec.wait_for("r1-s0", "stopped")
        return request
    finally:
        await sup.close()


async def test_drain_waits_for_requests_in_flight(state_dir):
    request = await _drained_mid_answer(state_dir)
    # then the request that was running finished whole before the engine stopped
    assert request.done()
    assert (await request).rstrip().endswith(b"data: [DONE]")


async def test_a_drain_outlasts_metrics_probes_a_busy_engine_misses(state_dir, monkeypatch):
    # given: an engine that counts its requests, but whose /metrics, busy answering, misses
    # every other probe past the first (vLLM on a loaded 2-core node: a 2 s probe timeout)
    from agentd import lifecycle
    from agentd.engines.fake import FakeEngine

    monkeypatch.setattr(lifecycle, "DRAIN_WITHOUT_METRIC_S", 0.3)
    counted = FakeEngine.in_flight
    probes = []

    async def busy(self, host, port):
        probes.append(port)
        return await counted(self, host, port) if len(probes) % 2 else None

    monkeypatch.setattr(FakeEngine, "in_flight", busy)
    # when: it is drained mid-answer
    request = await _drained_mid_answer(state_dir)
    # then: the missed probes did not end the drain past the short bound for engines
    # that cannot count: the answer finished whole before the engine stopped
    assert len(probes) > 4, probes
    assert request.done()
    assert (await request).rstrip().endswith(b"data: [DONE]")


async def test_a_download_that_progresses_is_not_a_hung_start(state_dir, tmp_path):
    weights = tmp_path / "weights"
    # The download outlasts the start deadline twice over. The deadline leaves the fake
    # engine time to start writing on a machine whose cores are busy (CI's two): at
    # 1.5 s, a start that took that long to begin its download was a hung start.
    args = ["--fetch-to", str(weights), "--fetch-time", "8", "--fetch-bytes", "2000000"]
    spec = shard(args=args, startup_timeout_s=4, profile=None)
    spec = spec.model_copy(
        update={"profile": spec.profile.model_copy(update={"model_path": str(weights)})}
    )
    sup, rec = await started(state_dir, spec)
    try:
        await rec.wait_for("r1-s0", "ready", timeout=30)
        assert sup.paths_in_use() == [str(weights)]
        progress = [e for e in rec.events if e.type == "fetch_progress"]
        assert progress and progress[-1].source == str(weights)
        assert progress[-1].bytes_done > progress[0].bytes_done > 0
        assert "failed" not in rec.states("r1-s0")
    finally:
        await sup.close()


async def test_the_adapters_a_shard_should_hold_are_in_use_like_its_weights(state_dir, tmp_path):
    # a weights clean-up must not take an adapter's file from under a replica that loads it
    from agentd import protocol

    adapter = protocol.AdapterSpec(name="sql", source=str(tmp_path / "sql.gguf"))
    spec = shard(profile=None).model_copy(update={"adapters": [adapter]})
    sup, rec = await started(state_dir, spec)
    try:
        await rec.wait_for("r1-s0", "ready", timeout=30)
        assert sup.paths_in_use() == [str(tmp_path / "sql.gguf")]
    finally:
        await sup.close()


async def test_adapters_load_and_unload_while_the_engine_serves_and_a_bad_one_says_why(
    state_dir, tmp_path
):
    # the fake engine's runtime LoRA API is vLLM's: nothing restarts
    (tmp_path / "sql").mkdir()
    sql = protocol.AdapterSpec(name="sql", source=str(tmp_path / "sql"))
    gone = protocol.AdapterSpec(name="gone", source=str(tmp_path / "nowhere"))
    base = shard(profile=profile("fake", max_adapters=1))
    sup, rec = await started(state_dir, base.model_copy(update={"adapters": [sql]}))
    try:
        await rec.wait_for("r1-s0", "ready")
        held = await adapters_reported(rec, lambda a: a.get("sql") == "loaded")
        (running,) = sup.running_shards()
        pid, port = running.pid, running.port
        _, body = await http_get("127.0.0.1", port, "/v1/models", 2)
        assert b'"sql"' in body, body

        # when: the desired set swaps it for one whose files are not there
        await sup.apply(desired(2, base.model_copy(update={"adapters": [gone]})))

        # then: the first is unloaded, the second reported failed with the engine's words,
        held = await adapters_reported(rec, lambda a: "gone" in a and "sql" not in a)
        assert held["gone"] == "failed"
        last = rec.events[-1]
        (failed,) = [a for a in last.adapters if a.name == "gone"]
        assert "No adapter found for" in failed.error, failed.error
        # and the engine kept serving, never restarted
        (running,) = sup.running_shards()
        assert (running.pid, running.state) == (pid, "ready")
        status, body = await http_get("127.0.0.1", port, "/v1/models", 2)
        assert status == 200 and b'"sql"' not in body
    finally:
        await sup.close()


async def test_tail_shows_the_engine_output(state_dir):
    sup, rec = await started(state_dir, shard())
    try:
        await rec.wait_for("r1-s0", "ready")
        assert sup.log_sources() == ["r1-s0"]
        lines = sup.tail("r1-s0", 2)
        assert lines[-1] == "fake engine: ready, serving tiny-llama"
        assert len(lines) == 2
        with pytest.raises(KeyError, match="no log source 'agent-x'"):
            sup.tail("agent-x", 10)
    finally:
        await sup.close()


async def test_progress_the_agent_reports_pushes_the_deadline_back(state_dir):
    spec = shard(args=["--load-time", "2.5"], startup_timeout_s=1.2)
    sup, rec = await started(state_dir, spec)
    try:

        async def fetching():
            for done in range(1, 100):
                await sup.fetch_progress("r1-s0", done * 1000, 100_000, "hf://tiny")
                await asyncio.sleep(0.4)

        reporter = asyncio.create_task(fetching())
        await rec.wait_for("r1-s0", "ready")
        reporter.cancel()
        assert "failed" not in rec.states("r1-s0")
        progress = [e for e in rec.events if e.type == "fetch_progress"]
        assert progress[0].bytes_total == 100_000 and progress[0].source == "hf://tiny"
    finally:
        await sup.close()


async def test_a_changed_spec_restarts_a_new_timeout_does_not(state_dir):
    sup, rec = await started(state_dir, shard())
    try:
        await rec.wait_for("r1-s0", "ready")
        first = sup.process_groups()["r1-s0"]
        await sup.apply(desired(2, shard(startup_timeout_s=60)))
        await asyncio.sleep(0.5)
        assert sup.process_groups()["r1-s0"] == first
        # when the profile's arguments change, then the engine is replaced
        mark = len(rec.events)
        await sup.apply(desired(3, shard(args=["--token-delay", "0.01"])))
        await rec.wait_for("r1-s0", "ready", after=mark)
        second = sup.process_groups()["r1-s0"]
        assert second != first and not pid_alive(first)
        assert "--token-delay" in sup.tail("r1-s0", 50)[-4]
    finally:
        await sup.close()


async def test_a_multi_node_follower_is_ready_once_running(state_dir):
    # A follower rank serves no HTTP (rank 0 does, and cannot be ready until the
    # followers joined), so running is all there is to see of it.
    spec = shard(args=["--hang"], rank=1, nnodes=2, leader_addr="10.0.0.11", leader_port=29500)
    sup, rec = await started(state_dir, spec, stop_grace_s=0.5)
    try:
        await rec.wait_for("r1-s0", "ready")
        assert rec.states("r1-s0") == ["pending", "starting", "ready"]
        assert sup.running_shards()[0].port > 0
    finally:
        await sup.close()


@pytest.mark.parametrize(
    "free_gb, fails",
    [(20, "GPU GPU-a has 20.0 GB free of 80.0; this shard's budget is 30 GB"), (30, None)],
)
async def test_a_share_of_a_gpu_starts_only_where_its_budget_is_free_now(state_dir, free_gb, fails):
    # given a GPU of 80 GB with free_gb free, as NVML says at the start
    def gpu_memory():
        return {"GPU-a": (80 * 1024, (80 - free_gb) * 1024)}

    spec = shard(
        gpu_uuids=["GPU-a"],
        gpu_memory_fraction=0.375,
        profile=profile(gpu_memory_gb=30),
    )
    sup, rec = await started(state_dir, spec, gpu_memory=gpu_memory)
    try:
        if fails:
            # then a shard whose budget is 30 GB fails at once, saying why
            failed = await rec.wait_for("r1-s0", "failed")
            assert failed.error == fails
            assert sup.process_groups() == {}
        else:
            await rec.wait_for("r1-s0", "ready")
    finally:
        await sup.close()
