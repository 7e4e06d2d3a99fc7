"""A two-"node" vLLM or SGLang group on one machine, started with llmgw's own argv and env.

    .venv/bin/python bench/multinode_gpu.py --engine vllm|sglang [--model M] [--timeout S]

For a machine with at least 2 NVIDIA GPUs and the engine installed. Checks that
the multi-node command lines agentd.engines builds (vllm.py: --nnodes, --node-rank,
--master-addr, --master-port, --headless; sglang.py: --nnodes, --node-rank,
--dist-init-addr) bring up one replica over two ranks. Each rank gets one GPU
through the adapter's CUDA_VISIBLE_DEVICES (GPU UUIDs, as placement gives them;
--indices for indices: vLLM before the UUID fix fails on UUIDs), the leader is
127.0.0.1 on free ports. Waits for rank 0's /health, sends one chat completion,
prints the time to ready and the answer, stops both; exit 1 when it fails.
--dry-run prints both argvs only. Not run on a GPU where it was written (none
there); only its dry run and a run against stub binaries were.
"""

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTION = [{"role": "user", "content": "Name the capital of France."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpus(indices: bool) -> list[str]:
    field = "index" if indices else "uuid"
    cmd = ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def http(port: int, path: str, body: dict | None = None, timeout: float = 5) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read()


def stop(procs: list[subprocess.Popen], grace: float = 30) -> None:
    for p in procs:  # the whole process group: the engines' workers are children
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for ready")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel size (tp*pp must be 2)")
    ap.add_argument("--pp", type=int, default=2, help="pipeline parallel size")
    ap.add_argument("--binary", help="the engine's binary (vllm) or Python (sglang)")
    ap.add_argument("--indices", action="store_true", help="GPU indices, not UUIDs")
    ap.add_argument("--dry-run", action="store_true", help="print both ranks' argv and stop")
    opts = ap.parse_args()
    if opts.tp * opts.pp != 2:
        sys.exit("tp * pp must be 2: one GPU on each of two ranks")

    sys.path.insert(0, str(ROOT))
    from agentd import protocol
    from agentd.engines import make_engines

    cards = gpus(opts.indices) or (["GPU-rank0", "GPU-rank1"] if opts.dry_run else [])
    if len(cards) < 2:
        sys.exit(f"needs 2 GPUs, found {len(cards)}")
    engine = make_engines({opts.engine: opts.binary} if opts.binary else {})[opts.engine]
    profile = protocol.ProfileSpec(
        name="bench-mn", engine=opts.engine, tp=opts.tp, pp=opts.pp, gpus_per_node=1, nodes=2
    )
    leader_port, ports = free_port(), [free_port(), free_port()]
    logs, procs, files = Path(tempfile.mkdtemp(prefix="llmgw-mn-")), [], []
    try:
        for rank in (0, 1):
            shard = protocol.DesiredShard(
                **{"shard_id": f"mn-s{rank}", "replica_id": "mn", "state": "running"},
                **{"model": opts.model, "profile": profile, "port": ports[rank]},
                **{"rank": rank, "nnodes": 2, "gpu_uuids": [cards[rank]]},
                **{"leader_addr": "127.0.0.1", "leader_port": leader_port},
            )
            launch = engine.build(profile, shard, host="127.0.0.1", port=ports[rank])
            print(f"rank {rank}: CUDA_VISIBLE_DEVICES={launch.env['CUDA_VISIBLE_DEVICES']}")
            print(f"rank {rank}: {' '.join(launch.argv)}", flush=True)
            if opts.dry_run:
                continue
            files.append(log := open(logs / f"rank{rank}.log", "wb"))
            io = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": subprocess.STDOUT}
            env = {**os.environ, **launch.env}
            procs.append(subprocess.Popen(launch.argv, env=env, start_new_session=True, **io))
        if opts.dry_run:
            return 0
        t0, ready = time.monotonic(), False
        while not ready and time.monotonic() - t0 < opts.timeout:
            if any(p.poll() is not None for p in procs):
                break
            try:
                ready = http(ports[0], engine.health_path)[0] == 200
            except OSError:
                pass
            time.sleep(0 if ready else 2)
        if not ready:
            for rank, p in enumerate(procs):
                tail = (logs / f"rank{rank}.log").read_text(errors="replace")[-3000:]
                print(f"--- rank {rank} (exit {p.poll()}), {logs}/rank{rank}.log:\n{tail}")
            print(f"FAIL: rank 0 not ready after {time.monotonic() - t0:.0f}s")
            return 1
        print(f"ready in {time.monotonic() - t0:.1f}s")
        ask = {"model": opts.model, "max_tokens": 32, "temperature": 0, "messages": QUESTION}
        try:
            _, body = http(ports[0], "/v1/chat/completions", ask, timeout=120)
            answer = json.loads(body)["choices"][0]["message"]["content"]
        except (OSError, ValueError, KeyError, IndexError) as exc:
            print(f"FAIL: chat completion: {exc!r}")
            return 1
        print(f"answer: {answer!r}")
        return 0
    finally:
        stop(procs)
        for f in files:
            f.close()
        print(f"stopped; logs in {logs}")


if __name__ == "__main__":
    sys.exit(main())
