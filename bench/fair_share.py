"""Fair share against a saturated replica: a light key's latency while a heavy key sends
ten times its traffic, with the gateway's queue in fair order and in arrival order.

    .venv/bin/python bench/fair_share.py [--seconds 20] [--token-delay 0.01]

One fake engine (``agentd.engines.fake``, ``--token-delay``: 16 tokens take
~0.16 s) behind the gateway (``llmgw_site.serve``) with
``LLMGW_GATEWAY_MAX_OUTSTANDING_PER_REPLICA=1`` (the replica takes one request
at a time) and ``LLMGW_GATEWAY_FAIR_QUEUE=100``. Ten client threads send with
the heavy key, one with the light key, each one request after another, for
``--seconds``; then the same with ``LLMGW_GATEWAY_FAIR_SHARE=false``, and the
two again in the other order (so the machine's drift falls on both). Prints each
key's requests and latency p50/p99 per mode. Figures for docs/benchmarks.md.
"""

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402 - the repository on the path first
    PY,
    Procs,
    free_port,
    gateway_env,
    percentile,
    run_setup,
    setup_django,
    start_gateway,
    wait_http,
)

MODEL = "busy"


def setup_db(engine_port: str) -> None:
    setup_django()
    from fleet.models import ApiKey, Engine, EngineProfile, Model, Node, Replica, Shard

    model = Model.objects.create(name=MODEL, desired_replicas=1)
    profile = EngineProfile.objects.create(
        model=model, name="bench", engine=Engine.FAKE, model_path="/none"
    )
    node = Node.objects.create(pk="bench-01", mgmt_addr="127.0.0.1", connected=True)
    replica = Replica.objects.create(model=model, profile=profile, state="ready")
    Shard.objects.create(replica=replica, node=node, port=int(engine_port), state="ready")
    for name in ("heavy", "light"):
        print(ApiKey.issue(name=name, scope="inference")[1])


def load(url: str, keys: dict[str, str], seconds: float) -> dict:
    latencies: dict[str, list[float]] = {"heavy": [], "light": []}
    failed: dict[str, int] = {"heavy": 0, "light": 0}
    stop = time.monotonic() + seconds

    def client(who: str) -> None:
        session = requests.Session()
        body = {"model": MODEL, "messages": [{"role": "user", "content": who}], "max_tokens": 16}
        headers = {"Authorization": f"Bearer {keys[who]}"}
        while time.monotonic() < stop:
            started = time.monotonic()
            resp = session.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            if resp.status_code == 200:
                latencies[who].append(time.monotonic() - started)
            else:
                failed[who] += 1

    threads = [threading.Thread(target=client, args=("heavy",)) for _ in range(10)]
    threads.append(threading.Thread(target=client, args=("light",)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = {}
    for who, values in latencies.items():
        out[who] = {
            "requests": len(values),
            "failed": failed[who],
            "p50_s": round(percentile(values, 50), 3),
            "p99_s": round(percentile(values, 99), 3),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--token-delay", type=float, default=0.01)
    p.add_argument("--setup-db", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.setup_db:
        setup_db(args.setup_db)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "logs").mkdir()
        env, redis = gateway_env(work, "fair")
        procs = Procs(work / "logs")
        try:
            port = free_port()
            engine = procs.start(
                "engine",
                [PY, "-m", "agentd.engines.fake", "--port", str(port), "--served-model-name",
                 MODEL, "--token-delay", str(args.token_delay)],
                env,
            )  # fmt: skip
            wait_http(f"http://127.0.0.1:{port}/health", engine)
            heavy, light = run_setup(__file__, str(port), env)
            keys = {"heavy": heavy, "light": light}
            results: dict[str, list[dict]] = {"fair": [], "arrival": []}
            for mode in ("fair", "arrival", "arrival", "fair"):
                genv = {
                    **env,
                    "LLMGW_GATEWAY_MAX_OUTSTANDING_PER_REPLICA": "1",
                    "LLMGW_GATEWAY_FAIR_QUEUE": "100",
                    "LLMGW_GATEWAY_FAIR_SHARE": "true" if mode == "fair" else "false",
                }
                gport, gproc = start_gateway(procs, genv)
                results[mode].append(load(f"http://127.0.0.1:{gport}", keys, args.seconds))
                gproc.terminate()
                gproc.wait(20)
        finally:
            procs.stop_all()
            if redis is not None:
                redis.stop()
    summary = {}
    for mode, runs in results.items():
        for who in ("heavy", "light"):
            summary[f"{mode}_{who}_requests"] = sum(r[who]["requests"] for r in runs)
            summary[f"{mode}_{who}_failed"] = sum(r[who]["failed"] for r in runs)
            summary[f"{mode}_{who}_p50_s"] = max(r[who]["p50_s"] for r in runs)
            summary[f"{mode}_{who}_p99_s"] = max(r[who]["p99_s"] for r in runs)
    for mode in ("fair", "arrival"):
        print(
            f"{mode:8} light: {summary[f'{mode}_light_requests']} requests, p50 "
            f"{summary[f'{mode}_light_p50_s']} s, p99 {summary[f'{mode}_light_p99_s']} s;  "
            f"heavy: {summary[f'{mode}_heavy_requests']} requests, p99 "
            f"{summary[f'{mode}_heavy_p99_s']} s"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
