"""Scale to zero and autoscaling: how long a client and the fleet wait, beside baselines.

    .venv/bin/python bench/autoscale.py [--rounds 5]

The whole stack as real processes (``tests.processes.Stack``: a private Redis,
Daphne, a Celery worker and beat, one agent) on a scratch SQLite database, with
the fleet's default reconcile interval (5 s) and load report (1 s). Two figures:

1. Time to first token of a streamed chat completion for a model scaled to zero
   (llama.cpp, the generated tiny model): the request triggers the start and
   waits. Baseline, in the same rounds: the same request to a model with a ready
   replica. Between rounds the cold model is scaled to zero again (its engine
   stops; the weights stay on the node).
2. Autoscaling's reaction to a load step (the fake engine, 2 s per request,
   target 2 in flight per replica, 1 to 3 replicas): from the step (6 clients
   at once) to the decision (its event) to 3 replicas ready. Baseline: an
   operator setting 3 replicas through the API, from the request to 3 ready.

Figures are for this machine, side by side; not a test.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def first_token_s(stack, model: str, timeout: float = 180) -> tuple[float, int]:
    """Seconds from sending a streamed request to its first data event; the HTTP status."""
    import requests

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
        for line in resp.iter_lines():
            if first is None and line.startswith(b"data: "):
                first = time.perf_counter() - t0
        return (first if first is not None else float("nan")), resp.status_code


def model_with_profile(stack, name: str, profile: dict, **fields) -> int:
    model = stack.api("post", "models/", json={"name": name, **fields})
    prof = stack.api("post", "engine-profiles/", json={"model": model["id"], **profile})
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": prof["id"]})
    return model["id"]


def ready_count(name: str) -> int:
    from fleet.models import Replica

    return Replica.objects.filter(model__name=name, state="ready").count()


def no_live_shards(name: str) -> bool:
    from fleet.models import Shard

    return not Shard.objects.filter(replica__model__name=name).exists()


def cold_start(stack, tiny: Path, rounds: int) -> dict:
    llama = {"name": "cpu", "engine": "llamacpp", "model_path": str(tiny)}
    model_with_profile(stack, "warm", llama, desired_replicas=1)
    cold_id = model_with_profile(
        stack,
        "cold",
        llama,
        desired_replicas=0,
        min_replicas=0,
        max_replicas=1,
        scale_to_zero_after_s=3600,
    )
    stack.wait(lambda: ready_count("warm") == 1, "the warm model", 180)
    first_token_s(stack, "warm")  # its first answer loads caches; not counted
    warm, cold = [], []
    for _ in range(rounds):
        stack.wait(lambda: no_live_shards("cold"), "the cold model to be at zero", 120)
        time.sleep(1)  # the gateway has the empty table
        warm.append(first_token_s(stack, "warm")[0])
        took, status = first_token_s(stack, "cold")
        if status != 200:
            raise RuntimeError(f"the cold model answered {status}")
        cold.append(took)
        warm.append(first_token_s(stack, "warm")[0])
        # Scaled to zero by hand once the gateway's reports no longer count that
        # request in flight (else the autoscaler would start it again at once).
        time.sleep(3)
        stack.api("patch", f"models/{cold_id}/", json={"desired_replicas": 0})
    return {"warm": warm, "cold": cold}


def load_step(stack) -> dict:
    from fleet.models import Event, Model
    from tests.processes import Load

    fake = {
        "name": "fake",
        "engine": "fake",
        "model_path": "/nonexistent/fake-weights",
        "args": ["--token-delay", "0.05"],  # 40 tokens: 2 s in flight
    }
    # Baseline: an operator scales a fixed model from 1 to 3.
    fixed_id = model_with_profile(stack, "fixed", fake, desired_replicas=1)
    stack.wait(lambda: ready_count("fixed") == 1, "the fixed model", 120)
    t0 = time.monotonic()
    stack.api("patch", f"models/{fixed_id}/", json={"desired_replicas": 3})
    stack.wait(lambda: ready_count("fixed") == 3, "3 fixed replicas", 120)
    operator_s = time.monotonic() - t0
    stack.api("patch", f"models/{fixed_id}/", json={"desired_replicas": 0})

    model_with_profile(
        stack,
        "steps",
        fake,
        desired_replicas=1,
        min_replicas=1,
        max_replicas=3,
        target_outstanding=2,
    )
    stack.wait(lambda: ready_count("steps") == 1, "the autoscaled model", 120)
    time.sleep(2)  # reports of an idle model first
    from django.utils import timezone

    step_at = timezone.now()
    t0 = time.monotonic()
    with Load(stack.url, stack.inference_key, model="steps", clients=6, max_tokens=40) as load:
        stack.wait(lambda: Event.objects.filter(model_name="steps").exists(), "a decision", 120)
        event = Event.objects.filter(model_name="steps").earliest("created_at")
        decided_s = (event.created_at - step_at).total_seconds()
        want = Model.objects.get(name="steps").desired_replicas
        stack.wait(lambda: ready_count("steps") >= want, f"{want} replicas", 120)
        ready_s = time.monotonic() - t0
    summary = load.summary()
    return {
        "operator_s": operator_s,
        "decided_s": decided_s,
        "ready_s": ready_s,
        "to": want,
        "reason": event.reason,
        "load": summary,
    }


def child(rounds: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-autoscale-"))
    from bench._common import stack_django

    stack_django(work)
    from agentd.tinygguf import write as write_tiny_model
    from tests.processes import Stack

    # Under the stack's directory: its agents read weights only there (model_dirs).
    tiny = write_tiny_model(work / "stack" / "weights" / "tiny-llama.gguf")
    # The fleet's defaults where they matter here (the stack's are for quick tests).
    stack = Stack(
        work / "stack",
        LLMGW_RECONCILE_INTERVAL_S="5",
        LLMGW_OUTAGE_GAP_S="30",
        LLMGW_GATEWAY_REFRESH_S="5",
    )
    try:
        stack.make_keys()
        stack.start_control_plane()
        both = {"llamacpp": sys.executable, "fake": sys.executable}
        stack.add_agent("cpu-a", engines={"binaries": both})
        from fleet.models import Node

        stack.wait(lambda: Node.objects.filter(pk="cpu-a", connected=True).exists(), "the agent")
        return {"cold": cold_start(stack, tiny, rounds), "step": load_step(stack)}
    finally:
        stack.close()


def ms(values) -> str:
    return f"{statistics.median(values) * 1000:8.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from bench._common import machine

    r = child(args.rounds)
    print(f"# scale to zero and autoscaling; {machine()}")
    warm, cold = r["cold"]["warm"], r["cold"]["cold"]
    print(f"{'time to first token (median ms)':34} {'p50':>8} {'min':>8} {'max':>8}")
    for label, v in (("ready replica (baseline)", warm), ("scaled to zero, started", cold)):
        print(f"{label:34} {ms(v)} {min(v) * 1000:8.0f} {max(v) * 1000:8.0f}   n={len(v)}")
    print(f"cold / ready: {statistics.median(cold) / statistics.median(warm):.0f}×")
    s = r["step"]
    print(f"operator sets 3 replicas -> 3 ready (baseline): {s['operator_s']:.1f} s")
    print(f"load step -> autoscaler decision:               {s['decided_s']:.1f} s")
    print(f"load step -> {s['to']} replicas ready:                  {s['ready_s']:.1f} s")
    print(f"decision: {s['reason']}")
    print(f"load during the step: {json.dumps(s['load'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
