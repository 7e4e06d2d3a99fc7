"""Reconciler benchmark: pass time and placement decisions per second at fleet scale.

    .venv/bin/python bench/reconcile.py                       # SQLite, all three levels
    .venv/bin/python bench/reconcile.py --pg postgres://postgres@127.0.0.1:5432
    .venv/bin/python bench/reconcile.py --levels 5000x2000

Each level (nodes × replicas; every node 8 H100s with NVLink and an IB fabric)
gets a fresh migrated database and a process of its own, which fills it and
measures, in the order a fleet lives them:

- snapshot: building placement's inventory from the database;
- decisions/s: the pure placement function placing every replica, each
  decision committed into the snapshot so the next one sees it;
- first pass: the pass that creates and places every replica;
- ready pass: every shard turned ready, the pass that marks replicas ready;
- steady pass: nothing to do, the pass beat runs every 5 s (median of 5);
- churn pass: 1 % of shards failed, the pass that stops and schedules them.

With --latency N it measures instead, over real processes (Daphne, a Celery
worker and beat, an agent socket), the time from `apply` to the desired set
reaching the agent (bench/_reconcile_latency.py).

Targets (issue 4): a steady full pass over 5,000 nodes and 2,000 replicas under
1 s, at least 1,000 placement decisions per second, and apply → desired set at
the agent under 1 s at p99.
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LEVELS = ["100x50", "1000x500", "5000x2000"]
REPLICAS_PER_MODEL = 50
SHARED_ENV = "LLMGW_BENCH_SHARED_GPUS"  # --shared, as the parent tells each level's process


def parent(args) -> int:
    from bench._common import Levels, machine, write_json

    redis = None
    redis_url = os.environ.get("REDIS_URL")
    with Levels(__file__, pg=args.pg, name="llmgw_bench_rec") as levels:
        if not redis_url:
            # The doorbells after each pass are part of its cost: a real Redis takes them.
            from fleet.devstack.redis import PrivateRedis

            redis = PrivateRedis(levels.work).start()
            redis_url = redis.url
        print(f"# reconciler benchmark on {levels.kind}; {machine()}")
        header = (
            f"{'nodes':>6} {'replicas':>8} {'snapshot ms':>11} {'decisions/s':>11} "
            f"{'first pass ms':>13} {'ready pass ms':>13} {'steady pass ms':>14} "
            f"{'churn pass ms':>13}"
        )
        print(header)
        results = []
        try:
            for level in args.levels:
                r = levels.run(level, REDIS_URL=redis_url)
                results.append(r)
                print(
                    f"{r['nodes']:>6} {r['replicas']:>8} {r['snapshot_ms']:>11.0f} "
                    f"{r['decisions_per_s']:>11.0f} {r['first_pass_ms']:>13.0f} "
                    f"{r['ready_pass_ms']:>13.0f} {r['steady_pass_ms']:>14.0f} "
                    f"{r['churn_pass_ms']:>13.0f}",
                    flush=True,
                )
        finally:
            if redis is not None:
                redis.stop()
    for r in results:
        for name in ("first", "steady"):
            phases = ", ".join(f"{k} {v:.0f}" for k, v in r[f"{name}_pass_phases_ms"].items())
            print(f"# {r['nodes']}x{r['replicas']} {name} pass, ms: {phases}")
    write_json(args.json, results)
    return 0


def child(level: str) -> None:
    from bench._common import django_child, timed

    django_child()
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from fleet.models import Node, Shard, ShardState
    from fleet.services import placement, placement_types, snapshot
    from fleet.services.reconciler import passes as reconcile

    n_nodes, n_replicas = (int(x) for x in level.split("x"))
    models = populate(n_nodes, n_replicas)
    now = timezone.now()

    def heartbeat():
        Node.objects.update(last_seen=now)

    snapshot_ms, _, snap = timed(snapshot.build)
    requests = []
    for model in models:
        req = snapshot.request_for(model, model.active_profile)
        requests += [req] * model.desired_replicas
    rates = []
    for _ in range(3):
        snap = snapshot.build()
        started = time.perf_counter()
        for req in requests:
            result = placement.place(snap, req)
            if isinstance(result, placement_types.Placement):
                snap.commit(result, req)
        rates.append(len(requests) / (time.perf_counter() - started))

    heartbeat()
    first_ms, _, first = timed(lambda: reconcile.run_pass(now))
    assert first.placed == n_replicas, f"placed {first.placed} of {n_replicas}"

    now += timedelta(seconds=5)
    heartbeat()
    Shard.objects.update(state=ShardState.READY)
    ready_ms, _, _ = timed(lambda: reconcile.run_pass(now))

    steady = []
    for _ in range(5):
        now += timedelta(seconds=5)
        heartbeat()
        ms, _, report = timed(lambda t=now: reconcile.run_pass(t))
        assert not report.changed(), report
        steady.append(ms)

    now += timedelta(seconds=5)
    heartbeat()
    failing = list(Shard.objects.order_by("pk").values_list("pk", flat=True)[::100])
    Shard.objects.filter(pk__in=failing).update(state=ShardState.FAILED, error="bench")
    churn_ms, _, churn = timed(lambda: reconcile.run_pass(now))
    assert churn.restarts == len(failing)

    print(
        json.dumps(
            {
                "database": connection.vendor,
                "nodes": n_nodes,
                "replicas": n_replicas,
                "models": len(models),
                "snapshot_ms": snapshot_ms,
                "decisions_per_s": statistics.median(rates),
                "first_pass_ms": first_ms,
                "ready_pass_ms": ready_ms,
                "steady_pass_ms": statistics.median(steady),
                "steady_pass_max_ms": max(steady),
                "churn_pass_ms": churn_ms,
                "churn_restarts": churn.restarts,
                "first_pass_phases_ms": first.phases,
                "steady_pass_phases_ms": report.phases,
            }
        )
    )


def populate(n_nodes: int, n_replicas: int):
    """Nodes as agents register them, and a catalog asking for ``n_replicas`` replicas.

    bulk_create, so no signal asks for a pass while the fleet is being built.
    """
    from django.utils import timezone

    from fleet.models import GPU, EngineProfile, FabricAttachment, LocalWeights, Model, Node

    now = timezone.now()
    shared = os.environ.get(SHARED_ENV) == "1"
    n_models = max(1, n_replicas // REPLICAS_PER_MODEL)
    Node.objects.bulk_create(
        Node(
            id=f"gpu-{i:05d}",
            hostname=f"gpu-{i:05d}.dc1",
            state="ready",
            connected=True,
            last_seen=now,
            registered_at=now,
            agent_labels={"zone": "abc"[i % 3], "rack": f"r{i // 40}"},
            engine_versions={"vllm": "0.11.0", "sglang": "0.5.4"},
            memory_total_mb=2 * 1024 * 1024,
        )
        for i in range(n_nodes)
    )
    GPU.objects.bulk_create(
        (
            GPU(
                node_id=f"gpu-{i:05d}",
                index=g,
                uuid=f"GPU-{i:08x}-{g:04x}-4b7d-9e2a-3c6f0d1b{g:04x}",
                name="NVIDIA H100 80GB HBM3",
                memory_total_mb=81559,
                numa_node=g // 4,
                nvlink_peers=[p for p in range(8) if p != g],
            )
            for i in range(n_nodes)
            for g in range(8)
        ),
        batch_size=5000,
    )
    FabricAttachment.objects.bulk_create(
        FabricAttachment(node_id=f"gpu-{i:05d}", fabric="ib0", hcas=["mlx5_0", "mlx5_1"])
        for i in range(n_nodes)
    )
    models = Model.objects.bulk_create(
        Model(
            name=f"model-{m:03d}",
            desired_replicas=n_replicas // n_models + (1 if m < n_replicas % n_models else 0),
            placement_policy="spread" if m % 2 else "binpack",
        )
        for m in range(n_models)
    )
    profiles = EngineProfile.objects.bulk_create(
        EngineProfile(
            model=model,
            name="h100",
            engine="vllm",
            gpu_class="H100",
            tp=(1, 2, 4)[m % 3],
            gpus_per_node=(1, 2, 4)[m % 3],
            # --shared: every other model asks for 20 GB of each GPU, not whole ones.
            gpu_memory_gb=20 if shared and m % 2 else None,
            model_path=f"org/model-{m:03d}",
            min_memory_gb=64,
        )
        for m, model in enumerate(models)
    )
    # Some nodes already hold some models' weights, as in a fleet that has run a while.
    LocalWeights.objects.bulk_create(
        LocalWeights(
            node_id=f"gpu-{i:05d}",
            path=f"/var/lib/llmgw/weights/org/model-{i % n_models:03d}",
            size_bytes=15 * 10**9,
        )
        for i in range(0, n_nodes, 7)
    )
    for model, profile in zip(models, profiles, strict=True):
        Model.objects.filter(pk=model.pk).update(active_profile=profile)
        model.active_profile = profile
    return models


def main() -> int:
    from bench._common import level_args

    parser = level_args(__doc__, LEVELS, "NODESxREPLICAS")
    parser.add_argument(
        "--latency",
        type=int,
        metavar="N",
        help="Instead: N samples of apply → desired set at the agent, over real processes",
    )
    parser.add_argument(
        "--shared",
        action="store_true",
        help="every other model asks for 20 GB of each GPU instead of whole GPUs (issue 31)",
    )
    args = parser.parse_args()
    if args.shared:
        os.environ[SHARED_ENV] = "1"
    if args.child:
        child(args.child)
        return 0
    if args.latency:
        from bench import _reconcile_latency

        return _reconcile_latency.parent(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
