"""LoRA adapters: time to first token for an adapter loaded already, and for one loaded on
demand, beside the base model's, in the same rounds.

    .venv/bin/python bench/adapters.py [--rounds 5]

The whole stack as real processes (``tests.processes.Stack``: a private Redis, the web
process, a Celery worker and beat, one agent) on a scratch SQLite database, with the
fleet's default reconcile interval (5 s). The generated tiny model on llama.cpp's
server, its profile holding one adapter at a time, and two adapters the benchmark
writes (``agentd.tinygguf.write_lora``). Each round asks, streamed: the base model;
the adapter its replica holds; then the other one, which takes the first one's place
(llama.cpp loads adapters at start: its server restarts with it).

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

from bench._common import stack_django  # noqa: E402
from bench.autoscale import first_token_s, model_with_profile  # noqa: E402


def held_now(name: str) -> str:
    """The adapter the model's ready shard holds loaded, or ""."""
    from fleet.models import Shard

    for shard in Shard.objects.filter(replica__model__name=name, state="ready"):
        for a in shard.adapters:
            if a.get("state") == "loaded":
                return a["name"]
    return ""


def child(rounds: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-adapters-"))
    stack_django(work)
    from agentd.tinygguf import write as write_tiny_model
    from agentd.tinygguf import write_lora
    from tests.processes import Stack

    tiny = write_tiny_model(work / "weights" / "tiny-llama.gguf")
    loras = {
        n: write_lora(work / "weights" / f"{n}.gguf", seed=s) for n, s in (("a1", 1), ("a2", 2))
    }
    stack = Stack(work / "stack", LLMGW_RECONCILE_INTERVAL_S="5", LLMGW_GATEWAY_REFRESH_S="5")
    try:
        stack.make_keys()
        stack.start_control_plane()
        stack.add_agent("cpu-a")
        profile = {"name": "cpu", "engine": "llamacpp", "model_path": str(tiny), "max_adapters": 1}
        model_id = model_with_profile(stack, "tiny", profile, desired_replicas=1)
        for name, path in loras.items():
            stack.api(
                "post", "adapters/", json={"name": name, "model": model_id, "source": str(path)}
            )
        stack.wait(lambda: held_now("tiny") == "a1", "a1 loaded", 180)
        first_token_s(stack, "tiny")  # caches warmed; not counted
        base, loaded, on_demand = [], [], []
        for _ in range(rounds):
            held = held_now("tiny")
            other = "a2" if held == "a1" else "a1"
            base.append(first_token_s(stack, "tiny")[0])
            loaded.append(first_token_s(stack, held)[0])
            took, status = first_token_s(stack, other)
            if status != 200:
                raise RuntimeError(f"{other} answered {status}")
            on_demand.append(took)
            stack.wait(lambda o=other: held_now("tiny") == o, f"{other} held", 60)
            time.sleep(1)  # the gateways have the table with it
        return {"base": base, "loaded": loaded, "on_demand": on_demand}
    finally:
        stack.close()


def summary(figures: dict) -> None:
    print("| figure | median | min – max |")
    print("| --- | ---: | ---: |")
    for key, label in (
        ("base", "first token, the base model"),
        ("loaded", "first token, an adapter its replica holds"),
        ("on_demand", "first token, an adapter loaded on demand"),
    ):
        values = figures[key]
        print(
            f"| {label} | {statistics.median(values) * 1000:.0f} ms "
            f"| {min(values) * 1000:.0f} – {max(values) * 1000:.0f} ms |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from bench._common import machine

    figures = child(args.rounds)
    print(f"# LoRA adapters, time to first token; {machine()}")
    summary(figures)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
