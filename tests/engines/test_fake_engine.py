"""The fake engine's own options, as a real process (``python -m agentd.engines.fake``)."""

import concurrent.futures
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.processes import ROOT, FakeEngine, free_port, wait_for

pytestmark = pytest.mark.live


def test_log_flood_writes_lines_of_the_asked_size_and_the_engine_still_answers(tmp_path):
    engine = FakeEngine(tmp_path, "tiny", "--log-flood", "500", "--log-flood-line-bytes", "120")
    try:

        def flood_lines():
            text = engine.log.read_bytes()
            whole = text.split(b"\n")[:-1]  # the last may still be being written
            lines = [ln for ln in whole if b"flood line" in ln]
            return lines if len(lines) >= 200 else None

        lines = wait_for(flood_lines, "200 flood lines in the engine's output", 30)

        assert {len(ln) + 1 for ln in lines} == {120}  # the newline included
        numbers = [int(ln.split()[4]) for ln in lines]
        assert numbers == list(range(len(numbers))), "in order, none lost"
        health = urllib.request.urlopen(f"http://127.0.0.1:{engine.port}/health", timeout=10)
        assert health.status == 200
    finally:
        engine.kill()


def test_a_stream_ends_with_a_usage_only_event_when_asked_as_vllm_does(tmp_path):
    engine = FakeEngine(tmp_path, "tiny")
    try:

        def stream(**extra) -> list:
            body = {"model": "tiny", "max_tokens": 3, "stream": True, "prompt": "hi", **extra}
            req = urllib.request.Request(
                f"http://127.0.0.1:{engine.port}/v1/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                text = resp.read().decode()
            return [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]

        plain = stream()
        asked = stream(stream_options={"include_usage": True})
    finally:
        engine.kill()
    assert plain[-1] == "[DONE]" and all("usage" not in e for e in plain)
    last = json.loads(asked[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    assert len(asked) == len(plain) + 1


def test_fail_every_answers_500_to_every_nth_completion_and_serves_the_rest(tmp_path):
    engine = FakeEngine(tmp_path, "tiny", "--fail-every", "3")
    try:

        def ask() -> tuple[int, dict]:
            req = urllib.request.Request(
                f"http://127.0.0.1:{engine.port}/v1/completions",
                data=json.dumps({"model": "tiny", "max_tokens": 2, "prompt": "hi"}).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    return resp.status, json.load(resp)
            except urllib.error.HTTPError as exc:
                return exc.code, json.load(exc)

        answers = [ask() for _ in range(9)]
    finally:
        engine.kill()
    assert [status for status, _ in answers] == [200, 200, 500] * 3
    assert answers[2][1]["error"]["type"] == "InternalServerError"  # as vLLM names its 500s
    assert answers[3][1]["choices"][0]["text"] == "the quick"


# ---- sleep and wake, under the NVML double --------------------------------------------

GIB = 2**30


class Sleepy:
    """The fake as the agent starts it to sleep in place: vLLM's dev endpoints on, holding
    --gpu-memory-bytes of the first GPU in an NVML double of one 80 GiB H100."""

    def __init__(self, tmp_path, *args: str, dev: str = "1", nvml=None):
        from tests.agent import nvml_data

        spec = nvml_data.hgx(count=1)
        self.uuid = spec["gpus"][0]["uuid"]
        self.nvml = nvml or nvml_data.write(tmp_path / "nvml.json", spec)
        self.port = free_port()
        self.log = tmp_path / f"fake-{self.port}.log"
        env = {**os.environ, "LLMGW_FAKE_NVML": str(self.nvml), "CUDA_VISIBLE_DEVICES": self.uuid,
               "VLLM_SERVER_DEV_MODE": dev}  # fmt: skip
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentd.engines.fake", "--port", str(self.port),
                 "--served-model-name", "tiny", *args],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def ready(self) -> None:
        wait_for(lambda: self.proc.poll() is not None or self.call("GET", "/health")[0] == 200,
                 "the fake to be ready", 20, logs=[self.log])  # fmt: skip
        assert self.proc.poll() is None, self.log.read_text()

    def call(self, method: str, path: str, body=None, timeout: float = 10) -> tuple[int, object]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, data, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
            try:
                return resp.status, json.loads(raw) if raw else None
            except ValueError:
                return resp.status, raw.decode()  # /health's "loading"
        except OSError:
            return 0, None
        finally:
            conn.close()

    def held(self) -> int:
        """What the NVML double says this engine holds on its GPU."""
        from agentd.nvml_double import FakeNVML

        lib = FakeNVML(self.nvml)
        lib.nvmlInit()
        procs = lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(0))
        return sum(p.usedGpuMemory for p in procs if p.pid == self.proc.pid)

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics").read().decode()
        return float(next(ln.rsplit(" ", 1)[1] for ln in text.splitlines() if ln.startswith(name)))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def complete(engine: Sleepy, timeout: float = 10) -> tuple[int, object]:
    return engine.call("POST", "/v1/completions", {"model": "tiny", "max_tokens": 3,
                                                   "prompt": "hi"}, timeout)  # fmt: skip


def test_level_1_releases_the_gpu_keeps_the_weights_in_host_memory_and_wakes(tmp_path):
    engine = Sleepy(tmp_path, "--gpu-memory-bytes", str(40 * GIB), "--weights-bytes",
                    str(16 * GIB), "--enable-sleep-mode")  # fmt: skip
    try:
        engine.ready()
        assert engine.held() == 40 * GIB
        assert engine.call("GET", "/is_sleeping") == (200, {"is_sleeping": False})
        # when it sleeps at level 1
        assert engine.call("POST", "/sleep?level=1&mode=wait") == (
            200, {"status": "sleeping", "level": 1},
        )  # fmt: skip
        # then its GPU memory is free, its weights wait in host memory, it still answers
        assert engine.held() == 0
        assert engine.metric("fake:host_memory_bytes") == 16 * GIB
        assert engine.metric('vllm:engine_sleep_state{engine="0",model_name="tiny",'
                             'sleep_state="weights_offloaded"}') == 1  # fmt: skip
        assert engine.call("GET", "/is_sleeping") == (200, {"is_sleeping": True})
        assert engine.call("GET", "/health")[0] == 200
        assert "holding 17179869184 bytes of host memory" in engine.log.read_text()
        # and a request sent while it sleeps waits for the wake, as vLLM queues it
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            queued = pool.submit(complete, engine)
            time.sleep(0.5)
            assert not queued.done()
            assert engine.call("POST", "/wake_up") == (200, {"status": "awake", "tags": None})
            status, answer = queued.result(10)
        assert status == 200 and answer["choices"][0]["text"] == "the quick brown"
        assert engine.held() == 40 * GIB
        assert engine.metric("fake:host_memory_bytes") == 0
    finally:
        engine.stop()


def test_level_2_keeps_nothing_and_serves_zeros_until_its_weights_are_read_again(tmp_path):
    engine = Sleepy(tmp_path, "--gpu-memory-bytes", str(40 * GIB), "--enable-sleep-mode",
                    "--load-time", "0.3")  # fmt: skip
    try:
        engine.ready()
        assert engine.call("POST", "/sleep?level=2")[0] == 200
        assert engine.held() == 0 and engine.metric("fake:host_memory_bytes") == 0
        # a bare wake maps the memory back, empty: the model answers "!"s
        assert engine.call("POST", "/wake_up") == (200, {"status": "awake", "tags": None})
        assert engine.held() == 40 * GIB
        assert complete(engine)[1]["choices"][0]["text"] == "! ! !"
        # vLLM's way back from level 2: weights, read again, then the KV cache (the
        # calls of agentd.engines.vllm.VLLM.wake_calls; the contract test sends them to vLLM)
        assert engine.call("POST", "/sleep?level=2")[0] == 200
        calls = [("/wake_up?tags=weights", None), ("/collective_rpc", {"method": "reload_weights"}),
                 ("/wake_up?tags=kv_cache", None)]  # fmt: skip
        answers = [engine.call("POST", path, body) for path, body in calls]
        assert answers == [
            (200, {"status": "sleeping", "tags": ["weights"]}),
            (200, {"results": [None]}),
            (200, {"status": "awake", "tags": ["kv_cache"]}),
        ]
        assert complete(engine)[1]["choices"][0]["text"] == "the quick brown"
    finally:
        engine.stop()


def test_a_wake_without_room_answers_500_as_vllm_and_takes_nothing(tmp_path):
    engine = Sleepy(tmp_path, "--gpu-memory-bytes", str(40 * GIB), "--enable-sleep-mode")
    squatter = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        engine.ready()
        assert engine.call("POST", "/sleep?level=1")[0] == 200
        from agentd.gpuclaims import claim

        # given another process took 50 of the GPU's 80 GiB while it slept
        claim(engine.nvml, squatter.pid, {engine.uuid: 50 * GIB})
        # when it is woken, the allocation fails as CUDA's does
        status, answer = engine.call("POST", "/wake_up")
        assert status == 500
        assert answer == {"error": {
            "message": "Call to wake_up method failed: CUDA Error: out of memory at <path>",
            "type": "InternalServerError", "param": None, "code": 500}}  # fmt: skip
        # then it holds nothing and still sleeps; once there is room it wakes
        assert engine.held() == 0
        assert engine.call("GET", "/is_sleeping") == (200, {"is_sleeping": True})
        claim(engine.nvml, squatter.pid, {})
        assert engine.call("POST", "/wake_up")[0] == 200
        assert engine.held() == 40 * GIB
    finally:
        squatter.kill()
        squatter.wait()
        engine.stop()


def test_it_will_not_start_on_a_gpu_without_room(tmp_path):
    from tests.agent import nvml_data

    spec = nvml_data.hgx(count=1)
    spec["processes"] = [{"pid": 4242, "gpu": 0, "used_bytes": 70 * GIB}]
    nvml = nvml_data.write(tmp_path / "nvml.json", spec)
    engine = Sleepy(tmp_path, "--gpu-memory-utilization", "0.5", nvml=nvml)
    try:
        assert engine.proc.wait(20) == 1
        # vLLM's own check of --gpu-memory-utilization, in its words
        assert re.search(
            r"ValueError: Free memory on device cuda:0 \(9\.\d+/79\.65 GiB\) on startup is less "
            r"than desired GPU memory utilization \(0\.5, 39\.82 GiB\)\. Decrease GPU memory "
            r"utilization or reduce GPU memory used by other processes\.",
            engine.log.read_text(),
        ), engine.log.read_text()
        assert engine.held() == 0
    finally:
        engine.stop()


def test_without_dev_mode_the_sleep_endpoints_are_unknown_paths(tmp_path):
    engine = Sleepy(tmp_path, "--enable-sleep-mode", dev="0")
    try:
        engine.ready()
        for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
            assert engine.call(method, path) == (404, {"detail": "Not Found"}), path
    finally:
        engine.stop()
