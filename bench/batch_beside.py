"""A batch beside interactive traffic: interactive time to first token with and without a
1,000-line batch running on the same model.

    .venv/bin/python bench/batch_beside.py [--lines 1000] [--rounds 2] [--alone-s 30]
        [--gap 0.2] [--concurrency 4]

The whole stack as real processes (``tests.processes.Stack``: a private Redis, the
web process, a Celery worker and beat, one agent) on a scratch SQLite, with
llama.cpp serving the generated tiny GGUF (``agentd.tinygguf``) on a CPU node.
One interactive client sends streamed chat completions (8 tokens) one after
another, ``--gap`` seconds apart, for the whole run, and records the seconds to
each answer's first data event. The run alternates, ``--rounds`` times:

- alone: ``--alone-s`` seconds of interactive requests only (the baseline);
- beside a batch: a batch of ``--lines`` chat completions (4 tokens each) is
  created through the Batch API; the phase lasts until it is ``completed``.

The batch's lines go through the gateway with ``LLMGW_BATCH_CONCURRENCY``
(``--concurrency``) lines in flight at most, taking what interactive requests
leave (docs/gateway.md, "How a batch runs"). Figures are for this machine,
side by side; not a test.
"""

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import machine, percentile, stack_django  # noqa: E402


class Interactive:
    """One client's streamed requests, one after another, each's TTFT tagged with the
    phase it started in."""

    def __init__(self, url: str, key: str, model: str, gap: float):
        self.url, self.key, self.model, self.gap = url, key, model, gap
        self.phase = "warm-up"
        self.ttft: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def one(self) -> float:
        import requests

        t0 = time.perf_counter()
        with requests.post(
            f"{self.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {self.key}"},
            json={
                "model": self.model,
                "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 8,
                "stream": True,
            },
            stream=True,
            timeout=60,
        ) as resp:
            first = None
            for line in resp.iter_lines():
                if first is None and line.startswith(b"data: "):
                    first = time.perf_counter() - t0
        if resp.status_code != 200 or first is None:
            raise RuntimeError(f"answered {resp.status_code}")
        return first

    def run(self) -> None:
        while not self.stop.is_set():
            phase = self.phase
            try:
                self.ttft.setdefault(phase, []).append(self.one())
            except Exception:  # noqa: BLE001 - counted, shown in the table
                self.errors[phase] = self.errors.get(phase, 0) + 1
            self.stop.wait(self.gap)


def lines(n: int, model: str) -> bytes:
    out = []
    for i in range(1, n + 1):
        body = {"model": model, "messages": [{"role": "user", "content": f"q{i}"}]}
        body["max_tokens"] = 4
        out.append(
            json.dumps(
                {
                    "custom_id": f"q-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
            )  # fmt: skip
        )
    return ("\n".join(out) + "\n").encode()


def child(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-batch-beside-"))
    redis = stack_django(work)
    from openai import OpenAI

    from agentd.tinygguf import write as write_tiny_model
    from fleet.models import ApiKeyScope, Replica
    from fleet.services.api_keys import create_api_key
    from tests.e2e.helpers import apply_model
    from tests.processes import Stack, free_port

    weights = work / "stack" / "weights"
    tiny = write_tiny_model(weights / "tiny-llama.gguf")
    stack = Stack(
        work / "stack",
        LLMGW_ESTIMATE_DIRS=str(weights),
        LLMGW_BATCH_CONCURRENCY=str(args.concurrency),
        LLMGW_BATCH_TEAM_CONCURRENCY=str(args.concurrency),
        LLMGW_BATCH_TICK_S="0.5",
    )
    stack.port = free_port()
    stack.env["LLMGW_BATCH_GATEWAY_URL"] = f"http://127.0.0.1:{stack.port}"
    phases: list[dict] = []
    try:
        stack.make_keys()
        _, batch_secret = create_api_key("batch jobs", scope=ApiKeyScope.INFERENCE)
        stack.start_control_plane()
        stack.add_agent("cpu-a", engines={"binaries": {"llamacpp": sys.executable}})
        apply_model(stack, tiny)
        stack.wait(
            lambda: Replica.objects.filter(model__name="tiny-llama", state="ready").exists(),
            "tiny-llama ready",
            180,
        )
        client = Interactive(stack.url, stack.inference_key, "tiny-llama", args.gap)
        client.thread.start()
        time.sleep(5)  # warm-up: the engine's first requests are slower
        batches = OpenAI(base_url=f"{stack.url}/v1", api_key=batch_secret, max_retries=2)
        for r in range(args.rounds):
            client.phase = f"alone-{r}"
            time.sleep(args.alone_s)
            client.phase = f"batch-{r}"
            upload = batches.files.create(
                file=(f"round-{r}.jsonl", lines(args.lines, "tiny-llama")), purpose="batch"
            )
            t0 = time.monotonic()
            batch = batches.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            while batch.status not in ("completed", "failed", "expired", "cancelled"):
                time.sleep(0.5)
                batch = batches.batches.retrieve(batch.id)
            took = time.monotonic() - t0
            phases.append(
                {
                    "round": r,
                    "status": batch.status,
                    "seconds": took,
                    "completed": batch.request_counts.completed,
                    "failed": batch.request_counts.failed,
                }  # fmt: skip
            )
        client.stop.set()
        client.thread.join(60)
        return {"ttft": client.ttft, "errors": client.errors, "batches": phases}
    finally:
        stack.close()
        redis.stop()


def table(results: dict) -> list[str]:
    ttft, errors = results["ttft"], results["errors"]

    def pooled(prefix):
        return [x for k, v in ttft.items() if k.startswith(prefix) for x in v]

    rows = [
        "| interactive | requests | errors | TTFT p50 | p90 | p99 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, prefix in (("alone", "alone-"), ("beside the batch", "batch-")):
        v = pooled(prefix)
        errs = sum(n for k, n in errors.items() if k.startswith(prefix))
        rows.append(
            f"| {label} | {len(v)} | {errs} | {percentile(v, 50) * 1000:.0f} ms | "
            f"{percentile(v, 90) * 1000:.0f} ms | {percentile(v, 99) * 1000:.0f} ms |"
        )
    alone, beside = pooled("alone-"), pooled("batch-")
    rows.append("")
    rows.append(
        f"p99 beside / alone: {percentile(beside, 99) / percentile(alone, 99):.2f}; "
        f"p50: {percentile(beside, 50) / percentile(alone, 50):.2f}"
    )
    for b in results["batches"]:
        rows.append(
            f"batch round {b['round']}: {b['status']}, {b['completed']} completed, "
            f"{b['failed']} failed in {b['seconds']:.1f} s "
            f"({b['completed'] / b['seconds']:.1f} lines/s)"
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--alone-s", type=float, default=30)
    ap.add_argument("--gap", type=float, default=0.2, help="seconds between interactive requests")
    ap.add_argument("--concurrency", type=int, default=4, help="LLMGW_BATCH_CONCURRENCY")
    args = ap.parse_args()
    started = time.monotonic()
    results = child(args)
    print(f"# a batch beside interactive traffic; {machine()}; load {os.getloadavg()[0]:.1f}")
    print(f"# whole run {time.monotonic() - started:.0f} s; {vars(args)}")
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
