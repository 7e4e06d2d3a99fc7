"""vLLM's CPU build bound to every CPU of the node (the agent's default,
``agentd.engines.vllm.cpu_binding``), to all but one (vLLM's own ``auto`` binding on
x86 keeps one back a rank), or not bound: the tokens a second it gives, and how late a
process beside it (an agent, the control plane) gets the CPU while it generates.

    .venv/bin/python bench/vllm_cpu_binding.py [--seconds 30] [--starts 1]

For each binding, one vLLM API server (vllm-cpu, from the machine's engines root, as
bench/vllm_cpu.py starts it) on the tiny Hugging Face model, with
``VLLM_CPU_OMP_THREADS_BIND`` set to that binding; ``--starts`` times each, the bindings
alternating. While it answers batches of 16 completions of 128 tokens (``ignore_eos``),
one after another for ``--seconds``, a probe process beside it wakes every 50 ms and
does a fixed piece of work (about 1.2 ms of Python on an idle core): how late each
wake-up came and how long the piece took are what an agent collecting its heartbeat,
or a web process answering, would feel. The probe also runs once with vLLM idle, as the floor.

Every process shares the machine's cores, so the figures are meaningful side by side.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import ROOT, commit, machine, percentile  # noqa: E402
from vllm_cpu import BATCH, BATCH_TOKENS, _batch  # noqa: E402

from fleet.devstack.vllm import VLLM_CPU_VERSION, tiny_model  # noqa: E402

PROBE = r"""
import json, sys, time
period, until = 0.05, time.monotonic() + float(sys.argv[1])
late, work = [], []
while time.monotonic() < until:
    due = time.monotonic() + period
    time.sleep(period)
    woke = time.monotonic()
    late.append(woke - due)
    sum(i * i for i in range(20000))
    work.append(time.monotonic() - woke)
print(json.dumps({"late": late, "work": work}))
"""


def probe(seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PROBE, str(seconds)], stdout=subprocess.PIPE, text=True
    )


def summary(samples: dict) -> dict:
    ms = {k: [v * 1000 for v in vs] for k, vs in samples.items()}
    return {
        f"{k}_{name}_ms": round(fn(vs), 2)
        for k, vs in ms.items()
        for name, fn in (
            ("p50", lambda v: percentile(v, 50)),
            ("p99", lambda v: percentile(v, 99)),
            ("max", max),
        )
    }


def measure(url: str, seconds: float) -> dict:
    """Batches one after another for ``seconds`` with the probe beside them: tokens/s
    (all the batches' tokens over their wall time; the slowest and fastest batch's) and
    how late the probe was."""
    asyncio.run(_batch(url + "/v1/completions", "none", BATCH, BATCH_TOKENS))  # warm-up
    side = probe(seconds)
    runs = []
    began = time.monotonic()
    while side.poll() is None:
        runs.append(asyncio.run(_batch(url + "/v1/completions", "none", BATCH, BATCH_TOKENS)))
    wall = time.monotonic() - began
    out, _ = side.communicate()
    return {
        "batches": len(runs),
        "tokens_per_s": sum(r["completion_tokens"] for r in runs) / wall,
        "tokens_per_s_min": min(r["tokens_per_s"] for r in runs),
        "tokens_per_s_max": max(r["tokens_per_s"] for r in runs),
        **summary(json.loads(out)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30, help="seconds of generating per start")
    p.add_argument("--starts", type=int, default=1, help="vLLM starts per binding")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "vllm_cpu_binding.json"))
    args = p.parse_args()

    from tests.processes.vllm import VllmServer, vllm_env

    cpus = sorted(os.sched_getaffinity(0))
    bindings = {
        "every CPU": f"{cpus[0]}-{cpus[-1]}",
        "one left unbound": ",".join(str(c) for c in cpus[:-1]),
        "nobind": "nobind",
    }
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-binding-"))
    env = vllm_env()
    model = tiny_model(work / "weights")
    idle = probe(args.seconds)
    results: dict = {
        "machine": machine(),
        "commit": commit(),
        "vllm_cpu": VLLM_CPU_VERSION,
        "bindings": bindings,
        "idle": summary(json.loads(idle.communicate()[0])),
        "runs": {name: [] for name in bindings},
    }
    print(f"probe, nothing generating: {results['idle']}", flush=True)
    for start in range(args.starts):
        for name in list(bindings)[:: 1 if start % 2 == 0 else -1]:
            server = VllmServer(
                env, model, work / f"vllm-{start}-{len(results['runs'][name])}.log",
                VLLM_CPU_OMP_THREADS_BIND=bindings[name],
            )  # fmt: skip
            try:
                server.wait_ready()
                r = measure(server.url, args.seconds)
            finally:
                server.stop()
            r["load1"] = os.getloadavg()[0]
            results["runs"][name].append(r)
            print(f"[{start + 1}/{args.starts}] {name} ({bindings[name]}): {r}", flush=True)
    results["medians"] = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        for name, rs in results["runs"].items()
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(json.dumps(results["medians"], indent=2))
    print(f"figures: {args.out}; logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
