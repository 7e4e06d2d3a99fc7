"""What the agent costs its node: CPU (% of one core) and RSS, against a real control plane.

Starts, in a temporary directory: an SQLite database (migrated), the web process on a
free port, and the real agent (`python -m agentd`) enrolled with a join token,
with the NVML test double standing in for an 8-GPU HGX H100 node (or none with
--cpu-node). Then it measures the agent process — its own CPU time plus any
children it waited for (engine version probes) — over two phases:

  1. a short heartbeat interval (default 1 s), so many heartbeats fit in the run;
  2. the production interval, 10 s.

CPU per second is modelled as idle + per_heartbeat / interval; the two phases
give both terms, so the 10 s figure is measured directly and also predicted
from the fast phase. RSS is the largest seen in either phase.

    .venv/bin/python bench/agent_overhead.py [--fast 1] [--fast-s 60] [--slow-s 120]

Redis: REDIS_URL if set, else the machine's on 127.0.0.1:6379 if it answers,
else a private one (fleet.devstack.redis).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.agent import nvml_data  # noqa: E402 - after the path is set


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited with {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listened on {port} within {timeout:g} s")


def redis_url(tmp: Path):
    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"], None
    with socket.socket() as s:
        s.settimeout(0.5)
        if s.connect_ex(("127.0.0.1", 6379)) == 0:
            return "redis://127.0.0.1:6379/0", None
    from fleet.devstack.redis import PrivateRedis

    redis = PrivateRedis(tmp).start()
    return redis.url, redis


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


class ControlPlane:
    def __init__(self, tmp: Path, interval: float):
        self.tmp = tmp
        url, self.redis = redis_url(tmp)
        self.env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{tmp / 'bench.sqlite3'}",
            "REDIS_URL": url,
            "LLMGW_STATE_DIR": str(tmp / "cp"),
            "LLMGW_CHANNEL_PREFIX": f"llmgw-bench-agent-{os.getpid()}",
            "LLMGW_HEARTBEAT_INTERVAL_S": str(interval),
            "PYTHONUNBUFFERED": "1",
            # The web process refuses to start without it unless DEBUG is on.
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
        }
        for command in (["migrate"], ["collectstatic"]):
            subprocess.run(
                [sys.executable, "manage.py", *command, "--no-input", "-v", "0"],
                cwd=ROOT,
                env=self.env,
                check=True,
            )
        self.daphne = None
        self.port = 0

    def join_token(self) -> str:
        out = subprocess.run(
            [sys.executable, "manage.py", "create_join_token", "bench", "--uses", "1"],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def start(self, interval: float) -> None:
        self.stop_daphne()
        self.env["LLMGW_HEARTBEAT_INTERVAL_S"] = str(interval)
        self.port = self.port or free_port()
        log = open(self.tmp / "web.log", "ab")  # noqa: SIM115 - held for the process's life
        self.daphne = subprocess.Popen(
            # The production server (make run): uvicorn through llmgw_site.serve.
            [
                sys.executable,
                "-m",
                "llmgw_site.serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for_port(self.port, self.daphne)

    def stop_daphne(self) -> None:
        if self.daphne is not None and self.daphne.poll() is None:
            self.daphne.terminate()
            self.daphne.wait(10)
        self.daphne = None

    def stop(self) -> None:
        self.stop_daphne()
        if self.redis is not None:
            self.redis.stop()


def start_agent(tmp: Path, url: str, token: str, cpu_node: bool) -> subprocess.Popen:
    weights = tmp / "weights"
    for name, size in (("qwen2.5-7b", 2**20), ("llama-3.1-8b", 2**20)):
        (weights / name).mkdir(parents=True, exist_ok=True)
        (weights / name / "model.safetensors").write_bytes(b"\0" * size)
    config = tmp / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "control_plane_url": url,
                "join_token": token,
                "node_id": "bench-node",
                "state_dir": str(tmp / "agent"),
                "weights_dirs": [str(weights)],
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_FAKE_NVML"}
    if not cpu_node:
        spec = tmp / "nvml.json"
        spec.write_text(json.dumps(nvml_data.hgx(nvml_data.H100)))
        env["LLMGW_FAKE_NVML"] = str(spec)
    log = open(tmp / "agent.out", "ab")  # noqa: SIM115 - held for the process's life
    return subprocess.Popen(
        [sys.executable, "-m", "agentd", "--config", str(config)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def registrations(tmp: Path) -> int:
    try:
        return (tmp / "agent.out").read_text(errors="replace").count("agentd.client registered")
    except FileNotFoundError:
        return 0


def wait_registered(tmp: Path, count: int, agent: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while registrations(tmp) < count:
        if agent.poll() is not None or time.monotonic() > deadline:
            sys.stderr.write((tmp / "agent.out").read_text(errors="replace"))
            raise SystemExit("the agent did not register")
        time.sleep(0.1)


def measure(proc: psutil.Process, seconds: float) -> tuple[float, int]:
    """CPU seconds per wall second over ``seconds``, and the largest RSS seen."""
    start_cpu, start = cpu_seconds(proc), time.monotonic()
    peak = proc.memory_info().rss
    while time.monotonic() - start < seconds:
        time.sleep(1)
        peak = max(peak, proc.memory_info().rss)
    return (cpu_seconds(proc) - start_cpu) / (time.monotonic() - start), peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fast", type=float, default=1.0, help="short heartbeat interval, s")
    ap.add_argument("--fast-s", type=float, default=60, help="seconds measured at --fast")
    ap.add_argument("--slow-s", type=float, default=120, help="seconds measured at 10 s")
    ap.add_argument("--warmup-s", type=float, default=5)
    ap.add_argument("--cpu-node", action="store_true", help="no NVML double: a CPU node")
    args = ap.parse_args()
    slow = 10.0

    with tempfile.TemporaryDirectory(prefix="llmgw-agent-bench-") as d:
        tmp = Path(d)
        cp = ControlPlane(tmp, args.fast)
        agent = None
        try:
            cp.start(args.fast)
            url = f"ws://127.0.0.1:{cp.port}/ws/agent/"
            agent = start_agent(tmp, url, cp.join_token(), args.cpu_node)
            proc = psutil.Process(agent.pid)
            wait_registered(tmp, 1, agent)
            time.sleep(args.warmup_s)
            fast_cpu, fast_rss = measure(proc, args.fast_s)

            # The same agent, reconnected to a control plane that says 10 s.
            cp.start(slow)
            wait_registered(tmp, 2, agent, timeout=120)
            time.sleep(args.warmup_s)
            slow_cpu, slow_rss = measure(proc, args.slow_s)
        finally:
            if agent is not None and agent.poll() is None:
                agent.terminate()
                agent.wait(20)
            cp.stop()

    # cpu/s = idle + per_hb / interval, solved from the two phases.
    per_hb = max(0.0, (fast_cpu - slow_cpu) / (1 / args.fast - 1 / slow))
    idle = max(0.0, slow_cpu - per_hb / slow)
    predicted = idle + per_hb / slow
    node = "CPU node" if args.cpu_node else "8×H100 (NVML double)"
    print(f"agent overhead, {node}, {psutil.cpu_count()} CPUs")
    print(
        f"  at {args.fast:g} s heartbeats, {args.fast_s:g} s: "
        f"{fast_cpu * 100:.2f} % of one core, peak RSS {fast_rss / 2**20:.1f} MiB"
    )
    print(
        f"  at {slow:g} s heartbeats, {args.slow_s:g} s: "
        f"{slow_cpu * 100:.2f} % of one core, peak RSS {slow_rss / 2**20:.1f} MiB"
    )
    print(
        f"  per heartbeat: {per_hb * 1000:.1f} ms CPU; between heartbeats: "
        f"{idle * 100:.3f} % of one core"
    )
    print(f"  predicted at 10 s from the two: {predicted * 100:.2f} % of one core")
    print(
        f"  budget: under 1 % of one core and 60 MiB RSS at 10 s -> "
        f"{'met' if slow_cpu < 0.01 and max(fast_rss, slow_rss) < 60 * 2**20 else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
