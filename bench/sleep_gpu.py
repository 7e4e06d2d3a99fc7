"""Sleep and wake on a real GPU: vLLM servers taking turns on it, against a cold start.

    python bench/sleep_gpu.py [--model Qwen/Qwen2.5-7B-Instruct ...] [--servers 2]
        [--turns 8] [--gpu-memory-utilization 0.55] [--level 1] [--python PY]

For a machine with an NVIDIA GPU and vLLM's CUDA build (``--python``: the Python it is
installed in; the weights already downloaded, e.g. ``huggingface-cli download
Qwen/Qwen2.5-7B-Instruct``). Standalone: the standard library and ``requests``,
nothing of llmgw; it plays what an llmgw node does when models take turns on one
GPU (docs/operations.md, "Taking turns on one GPU"), without the control plane.

1. Starts ``--servers`` vLLM API servers one after another on one GPU, each with
   ``--enable-sleep-mode``, ``VLLM_SERVER_DEV_MODE=1`` (which serves /sleep,
   /wake_up and /is_sleeping) and ``--gpu-memory-utilization`` above half, so only
   one fits awake: each start is timed (launch to /health, and to a first token),
   then the server is put to sleep (``POST /sleep?level=1``) to make room for the
   next. The first start of a model may include its download and compile caches.
2. Turns: the awake server sleeps and the next wakes (``POST /wake_up``), then a
   streamed chat completion: the wake, its first token, and a second request's
   first token (the awake baseline). "Asleep → first token" is the wake plus the
   first token, what a request waits for a replica that sleeps when the GPU has
   room; "switch" adds the other's sleep, when it must make way first.
3. Cold start again: every server asleep, the first one stopped and started anew
   (weights in the page cache, compile caches warm: a cold start at its best), to
   its first token.

vLLM's endpoints as docs/features/sleep_mode.md ("Online Serving") gives them:
``POST /sleep?level=1|2``, ``POST /wake_up`` (after level 2:
``/wake_up?tags=weights``, ``POST /collective_rpc {"method": "reload_weights"}``,
``/wake_up?tags=kv_cache``), ``GET /is_sleeping``. Goal: a first token from
asleep in 2 s or less for an 8B model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

GOAL_S = 2.0
DEFAULT_MODELS = ["Qwen/Qwen2.5-7B-Instruct"]


class Server:
    """One ``vllm.entrypoints.openai.api_server`` process with sleep mode, on one GPU."""

    def __init__(self, args, index: int, model: str, logs: Path):
        self.model = model
        self.name = f"m{index}"
        self.port = args.base_port + index
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = logs / f"{self.name}.log"
        self.argv = [
            args.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--served-model-name", self.name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--enable-sleep-mode",
            "--gpu-memory-utilization", str(args.gpu_memory_utilization),
            "--max-model-len", str(args.max_model_len),
            *args.vllm_arg,
        ]  # fmt: skip
        self.env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        self.env["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float) -> float:
        """Launch and wait for /health; seconds from the launch."""
        began = time.monotonic()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        while time.monotonic() - began < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}"
                )
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - began
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer /health in {timeout:g} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def post(self, path: str, body: dict | None = None) -> float:
        """A POST to a development endpoint; seconds it took. Anything but 200 stops the run."""
        began = time.monotonic()
        resp = requests.post(self.url + path, json=body, timeout=600)
        if resp.status_code != 200:
            raise RuntimeError(f"{self.name}: POST {path}: {resp.status_code} {resp.text[:300]}")
        return time.monotonic() - began

    def sleeping(self) -> bool:
        resp = requests.get(self.url + "/is_sleeping", timeout=10)
        resp.raise_for_status()
        return bool(resp.json().get("is_sleeping"))

    def sleep(self, level: int) -> float:
        took = self.post(f"/sleep?level={level}")
        if not self.sleeping():
            raise RuntimeError(f"{self.name}: /sleep answered 200 but /is_sleeping says awake")
        return took

    def wake(self, level: int) -> float:
        """Wake; after level 2 the weights are read again before the KV cache returns."""
        if level == 1:
            took = self.post("/wake_up")
        else:
            took = self.post("/wake_up?tags=weights")
            took += self.post("/collective_rpc", {"method": "reload_weights"})
            took += self.post("/wake_up?tags=kv_cache")
        if self.sleeping():
            raise RuntimeError(f"{self.name}: woken but /is_sleeping says asleep")
        return took

    def first_token(self, max_tokens: int = 16) -> float:
        """Seconds from sending a streamed chat completion to its first text."""
        began = time.monotonic()
        with requests.post(
            self.url + "/v1/chat/completions",
            json={
                "model": self.name,
                "messages": [{"role": "user", "content": "Say hello in five words."}],
                "max_tokens": max_tokens,
                "stream": True,
            },
            stream=True,
            timeout=600,
        ) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    return time.monotonic() - began
        raise RuntimeError(f"{self.name}: the stream ended without text")


def gpu_used_gib(gpu: int) -> float | None:
    """The GPU's memory in use by nvidia-smi, or None where it is not there."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "-i", str(gpu), "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        return float(out.stdout.strip()) / 1024
    except ValueError:
        return None


def secs(values: list[float], unit: str = "s") -> str:
    """Median (min – max) of ``values``, in ``unit``; "-" for none."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mid = f"{statistics.median(values):.2f} {unit}"
    if len(values) == 1:
        return mid
    return f"{mid} ({min(values):.2f} – {max(values):.2f})"


def run(args) -> dict:
    models = args.model or DEFAULT_MODELS
    logs = Path(args.logs or tempfile.mkdtemp(prefix="llmgw-sleep-gpu-"))
    logs.mkdir(parents=True, exist_ok=True)
    servers = [Server(args, i, models[i % len(models)], logs) for i in range(args.servers)]
    out = {"first_start": [], "first_start_token": [], "asleep_gib": [], "sleep": []}
    out.update(wake=[], after_wake=[], asleep_to_token=[], switch=[], awake=[])
    print(f"logs in {logs}", file=sys.stderr)
    try:
        # 1. One after another: each started, answered, and put to sleep for the next.
        for i, s in enumerate(servers):
            began = time.monotonic()
            out["first_start"].append(s.start(args.start_timeout))
            s.first_token()
            out["first_start_token"].append(time.monotonic() - began)
            if i < len(servers) - 1:
                out["sleep"].append(s.sleep(args.level))
                out["asleep_gib"].append(gpu_used_gib(args.gpu))
            print(f"  {s.name} ({s.model}) up in {out['first_start'][-1]:.1f} s", file=sys.stderr)

        # 2. Turns: the awake one sleeps, the next wakes and answers.
        awake = len(servers) - 1
        for turn in range(args.turns):
            nxt = (awake + 1) % len(servers)
            began = time.monotonic()
            out["sleep"].append(servers[awake].sleep(args.level))
            woke_at = time.monotonic()
            out["wake"].append(servers[nxt].wake(args.level))
            out["after_wake"].append(servers[nxt].first_token())
            done = time.monotonic()
            out["asleep_to_token"].append(done - woke_at)
            out["switch"].append(done - began)
            out["awake"].append(servers[nxt].first_token())
            awake = nxt
            print(
                f"  turn {turn + 1}: {servers[nxt].name} woke in {out['wake'][-1]:.2f} s, "
                f"first token {out['after_wake'][-1]:.2f} s after",
                file=sys.stderr,
            )

        # 3. A cold start of the first model again, the others asleep.
        servers[awake].sleep(args.level)
        servers[0].stop()
        began = time.monotonic()
        out["cold_start"] = [servers[0].start(args.start_timeout)]
        servers[0].first_token()
        out["cold_start_token"] = [time.monotonic() - began]
        out["awake_gib"] = gpu_used_gib(args.gpu)
    finally:
        for s in servers:
            s.stop()
    out["models"] = models
    return out


def report(args, r: dict) -> None:
    total = "nvidia-smi not found"
    if shutil.which("nvidia-smi"):
        q = subprocess.run(
            ["nvidia-smi", "-i", str(args.gpu), "--query-gpu=name,memory.total",
             "--format=csv,noheader"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        total = q.stdout.strip()
    print(f"# vLLM sleep level {args.level}, {args.servers} servers on GPU {args.gpu} ({total})")
    print(f"# models: {', '.join(r['models'])}; util {args.gpu_memory_utilization} each")
    rows = [
        ("first start of each, launch → /health", r["first_start"], "s"),
        ("first start of each, launch → first token", r["first_start_token"], "s"),
        ("cold start again (caches warm), launch → /health", r["cold_start"], "s"),
        ("cold start again, launch → first token", r["cold_start_token"], "s"),
        ("sleep (`POST /sleep`)", r["sleep"], "s"),
        ("wake (`POST /wake_up`)", r["wake"], "s"),
        ("first token after the wake", r["after_wake"], "s"),
        ("**asleep → first token** (wake + first token)", r["asleep_to_token"], "s"),
        ("switch: the other's sleep + wake + first token", r["switch"], "s"),
        ("awake: first token of the next request (baseline)", r["awake"], "s"),
        ("GPU memory in use, every server started so far asleep", r["asleep_gib"], "GiB"),
        ("GPU memory in use, one awake and the others asleep", [r["awake_gib"]], "GiB"),
    ]
    print("| figure | median (min – max) |")
    print("| --- | ---: |")
    for label, values, unit in rows:
        print(f"| {label} | {secs(values, unit)} |")
    goal = statistics.median(r["asleep_to_token"])
    cold = r["cold_start_token"][0]
    verdict = "met" if goal <= GOAL_S else "missed"
    print(f"goal (asleep → first token ≤ {GOAL_S:g} s): {verdict}, {goal:.2f} s median")
    print(f"cold start again / asleep: ×{cold / goal:.0f}")
    print(f"raw: {json.dumps(r)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        action="append",
        help=f"repeat for more; default {DEFAULT_MODELS[0]}, each server",
    )
    ap.add_argument("--servers", type=int, default=2, help="servers on the one GPU (2 or more)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--level", type=int, choices=(1, 2), default=1, help="sleep level")
    ap.add_argument(
        "--gpu-memory-utilization", type=float, default=0.55,
        help="each server's share of the GPU: above 1/2, so only one fits awake",
    )  # fmt: skip
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device index")
    ap.add_argument("--python", default=sys.executable, help="a Python with vLLM installed")
    ap.add_argument("--base-port", type=int, default=8100)
    ap.add_argument("--start-timeout", type=float, default=1200)
    ap.add_argument("--logs", help="where the servers' logs go (default: a new temp dir)")
    ap.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        help="one more vLLM argument, as --vllm-arg=--enforce-eager",
    )
    args = ap.parse_args()
    if args.servers < 2:
        ap.error("--servers: at least 2, to take turns")
    if args.gpu_memory_utilization * 2 <= 1:
        ap.error("--gpu-memory-utilization: above 0.5, or two servers fit awake at once")
    report(args, run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
