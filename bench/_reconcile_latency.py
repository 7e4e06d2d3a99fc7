"""bench/reconcile.py --latency: from `apply` to the desired set at the agent, over real processes.

A private Redis, Daphne, a Celery worker and beat run on a fresh database; one
simulated agent (an 8 × H100 node, the same one bench/agents.py uses) enrols
over the real socket, heartbeats, and acknowledges every desired set. Each
sample applies a catalog that asks for one replica of a new model and waits
until a desired set naming that model's shard arrives at the agent: the kick
after commit, the queued pass, the placement, the doorbell through Redis and
the socket's send, all in one figure. Then the model is scaled to zero, which
frees its GPU for the next sample.
"""

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CATALOG = """
models:
  - name: {name}
    replicas: {replicas}
    profiles:
      - name: h100
        engine: vllm
        model_path: org/{name}
        gpus_per_node: 1
"""


def latencies_ms(xs):
    return [x * 1000 for x in xs]


def parent(args) -> int:
    from bench._common import ScratchDatabases, machine, start_daphne

    kind = "postgresql" if args.pg else "sqlite"
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-latency-"))
    dbs = ScratchDatabases(kind, pg_url=args.pg or "", name="llmgw_bench_lat", workdir=work)
    dbs.prepare_template(work / "migrate.log")
    url = dbs.fresh("run")
    redis = None
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        from fleet.devstack.redis import PrivateRedis

        redis = PrivateRedis(work).start()
        redis_url = redis.url
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "REDIS_URL": redis_url,
        "LLMGW_STATE_DIR": str(work),
        "LLMGW_CHANNEL_PREFIX": f"bench-latency-{os.getpid()}",
        "LOG_LEVEL": "WARNING",
    }
    procs = []
    daphne = start_daphne(env, work / "daphne.log")
    try:
        for name, argv in (
            ("worker", ["worker", "--concurrency", "2", "--without-gossip", "--without-mingle"]),
            ("beat", ["beat", "-s", str(work / "beat-schedule")]),
        ):
            with open(work / f"{name}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "celery", "-A", "llmgw_site", *argv],
                        cwd=ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        out = subprocess.run(
            [sys.executable, __file__, daphne.ws_url, str(args.latency)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        daphne.stop()
        dbs.drop(url)
        dbs.drop_template()
        if redis is not None:
            redis.stop()
    if out.returncode:
        print(out.stdout, out.stderr, file=sys.stderr)
        return out.returncode
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"# apply → desired set at the agent, {kind}; {machine()}")
    print(
        f"samples {r['samples']}: p50 {r['p50_ms']:.0f} ms, p90 {r['p90_ms']:.0f} ms, "
        f"p99 {r['p99_ms']:.0f} ms, max {r['max_ms']:.0f} ms"
    )
    print(f"# each, ms: {r['all_ms']}")
    return 0


async def measure(ws_url: str, samples: int) -> dict:
    from datetime import timedelta

    from asgiref.sync import sync_to_async
    from websockets.asyncio.client import connect

    from bench._agent_sim import register_msg
    from fleet.services import catalog
    from fleet.services.access import create_join_token

    _, secret = await sync_to_async(create_join_token)("bench", ttl=timedelta(hours=1))
    ws = await connect(ws_url, additional_headers={"Authorization": f"Bearer {secret}"}, proxy=None)
    await ws.send(json.dumps(register_msg(0)))
    arrivals: asyncio.Queue = asyncio.Queue()
    version = 0

    async def read():
        nonlocal version
        async for raw in ws:
            msg = json.loads(raw)
            if msg["type"] == "desired":
                version = max(version, msg["version"])
                await arrivals.put((time.perf_counter(), {s["model"] for s in msg["shards"]}))
                await ws.send(
                    json.dumps({"type": "ack", "v": 1, "of": "desired", "version": version})
                )

    async def heartbeat():
        seq = 0
        while True:
            seq += 1
            await ws.send(
                json.dumps({"type": "heartbeat", "v": 1, "seq": seq, "desired_version": version})
            )
            await asyncio.sleep(5)

    tasks = [asyncio.create_task(read()), asyncio.create_task(heartbeat())]
    await warm_up()
    apply = sync_to_async(catalog.apply, thread_sensitive=False)
    latencies = []
    for i in range(samples):
        name = f"latency-{i:03d}"
        await asyncio.sleep(random.uniform(0.2, 0.7))  # not in step with beat
        while not arrivals.empty():
            arrivals.get_nowait()
        started = time.perf_counter()
        await apply(CATALOG.format(name=name, replicas=1))
        async with asyncio.timeout(30):
            while True:
                at, models = await arrivals.get()
                if name in models:
                    latencies.append(at - started)
                    break
        await apply(CATALOG.format(name=name, replicas=0))
    for t in tasks:
        t.cancel()
    await ws.close()
    ms = sorted(x * 1000 for x in latencies)
    return {
        "all_ms": [round(x) for x in latencies_ms(latencies)],
        "samples": len(ms),
        "p50_ms": statistics.median(ms),
        "p90_ms": ms[int(0.9 * (len(ms) - 1))],
        "p99_ms": ms[int(0.99 * (len(ms) - 1))],
        "max_ms": ms[-1],
    }


async def warm_up() -> None:
    """Until the worker has run a pass: its start-up is not what is measured."""
    from asgiref.sync import sync_to_async

    from fleet.models import FleetStatus

    def passes():
        status = FleetStatus.objects.filter(pk=1).first()
        return status.passes if status else 0

    async with asyncio.timeout(120):
        while await sync_to_async(passes)() < 2:
            await asyncio.sleep(0.5)


def child(ws_url: str, samples: int) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    import django

    django.setup()
    print(json.dumps(asyncio.run(measure(ws_url, samples))))


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]))
