"""Weights clean-up benchmark: the pass's selection over a fleet's weights, beside a baseline.

    .venv/bin/python bench/weights_gc.py                                  # SQLite
    .venv/bin/python bench/weights_gc.py --pg postgres://postgres@127.0.0.1:5432
    .venv/bin/python bench/weights_gc.py --levels 5000x20

Each level (nodes × weights entries per node) gets a fresh migrated database
and a process of its own, which fills it in bulk, as a fleet that has run a
while: every node runs one shard of one of 100 models and holds 20 entries,
one of them its shard's; the rest unused for a few hours (1 % past the day's
retention), one node in a hundred with its weights filesystem past the high
watermark. Then, side by side in the same process, median of 7:

- count: ``SELECT COUNT(*)`` over the weights rows (the baseline: the least
  any pass over them costs);
- read: the raw rows the pass reads, fetched and nothing more;
- select: the clean-up's selection (``weights_gc.cleanup.decide``): every row,
  shard and filesystem read, every entry judged, the proposals and reasons made.
  The sending (marking, events, doorbells) is not in it.

Target (issue 14): select under 1 s at 5,000 nodes × 20 entries.
"""

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LEVELS = ["5000x20"]
MODELS = 100
RUNS = 7


def parent(args) -> int:
    from bench._common import Levels, machine, write_json

    results = []
    with Levels(__file__, pg=args.pg, name="llmgw_bench_wgc") as levels:
        print(f"# weights clean-up benchmark on {levels.kind}; {machine()}")
        print(
            f"{'nodes':>6} {'entries':>8} {'count ms':>9} {'read ms':>8} {'select ms':>10} "
            f"{'select/read':>11} {'proposals':>9}   (wall; then CPU of this process)"
        )
        for level in args.levels:
            r = levels.run(level)
            results.append(r)
            print(
                f"{r['nodes']:>6} {r['entries']:>8} {r['count_ms']:>9.1f} {r['read_ms']:>8.0f} "
                f"{r['select_ms']:>10.0f} {r['select_ms'] / r['read_ms']:>10.1f}x "
                f"{r['proposals']:>9}",
                flush=True,
            )
            print(
                f"{'cpu':>6} {'':>8} {r['count_cpu_ms']:>9.1f} {r['read_cpu_ms']:>8.0f} "
                f"{r['select_cpu_ms']:>10.0f} {r['select_cpu_ms'] / r['read_cpu_ms']:>10.1f}x"
            )
            print(f"#   select runs, wall ms: {', '.join(f'{v:.0f}' for v in r['select_runs_ms'])}")
    write_json(args.json, results)
    return 0


def child(level: str) -> None:
    from bench._common import django_child, timed

    django_child()
    from django.db import connection

    from fleet.models import LocalWeights
    from fleet.services.weights_gc import cleanup, facts

    n_nodes, per_node = (int(x) for x in level.split("x"))
    populate(n_nodes, per_node)
    table = LocalWeights._meta.db_table

    def count():
        with connection.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {table}")
            return cur.fetchone()[0]

    def read():
        with connection.cursor() as cur:
            cur.execute(*facts.weights_query(time.time()))
            return len(cur.fetchall())

    assert count() == n_nodes * per_node
    runs = {k: [] for k in ("count", "read", "select")}
    cpu = {k: [] for k in runs}
    proposals = 0
    for _ in range(RUNS):  # interleaved, so a noisy moment hits all three alike
        for name, fn in (("count", count), ("read", read), ("select", cleanup.decide)):
            ms, cpu_ms, value = timed(fn)
            runs[name].append(ms)
            cpu[name].append(cpu_ms)
        proposals = len(value[1].proposals)
    out = {
        "database": connection.vendor,
        "nodes": n_nodes,
        "entries": n_nodes * per_node,
        "proposals": proposals,
        "select_runs_ms": runs["select"],
    }
    for name in runs:
        out[f"{name}_ms"] = statistics.median(runs[name])
        out[f"{name}_cpu_ms"] = statistics.median(cpu[name])
    print(json.dumps(out))


def populate(n_nodes: int, per_node: int) -> None:
    """A fleet that has run a while, in bulk: no signal, no pass, while it is built."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import (
        EngineProfile,
        LocalWeights,
        Model,
        Node,
        Replica,
        Shard,
        Storage,
    )

    now = timezone.now()
    w = "/var/lib/llmgw/weights"
    Node.objects.bulk_create(
        Node(id=f"gpu-{i:05d}", state="ready", connected=True, last_seen=now, registered_at=now)
        for i in range(n_nodes)
    )
    models = Model.objects.bulk_create(Model(name=f"model-{m:03d}") for m in range(MODELS))
    profiles = EngineProfile.objects.bulk_create(
        EngineProfile(model=m, name="h100", engine="vllm", model_path=f"{w}/org/{m.name}")
        for m in models
    )
    replicas = Replica.objects.bulk_create(
        (
            Replica(model=models[i % MODELS], profile=profiles[i % MODELS], state="ready")
            for i in range(n_nodes)
        ),
        batch_size=2000,
    )
    Shard.objects.bulk_create(
        (
            Shard(
                replica=r,
                node_id=f"gpu-{i:05d}",
                port=8000,
                state="ready",
                desired_state="running",
                spec=profiles[i % MODELS].spec(),
            )
            for i, r in enumerate(replicas)
        ),
        batch_size=2000,
    )
    Storage.objects.bulk_create(
        (
            Storage(
                node_id=f"gpu-{i:05d}",
                path=p,
                total_bytes=4 * 10**12,
                # One node in a hundred has its weights filesystem 90 % full.
                free_bytes=4 * 10**11 if (i % 100 == 0 and p == w) else 3 * 10**12,
            )
            for i in range(n_nodes)
            for p in ("/var/lib/llmgw", w)
        ),
        batch_size=5000,
    )
    LocalWeights.objects.bulk_create(
        (
            LocalWeights(
                node_id=f"gpu-{i:05d}",
                path=f"{w}/org/model-{(i + k) % MODELS:03d}",
                size_bytes=(5 + k) * 10**9,
                # k == 0 is the shard's own; the rest unused for a few hours, 1 % past a day.
                unused_since=None
                if k == 0
                else now - timedelta(hours=30 if (i * per_node + k) % 100 == 0 else 1 + k),
            )
            for i in range(n_nodes)
            for k in range(per_node)
        ),
        batch_size=5000,
    )


def main() -> int:
    from bench._common import level_args

    args = level_args(__doc__, LEVELS, "NODESxENTRIES").parse_args()
    if args.child:
        child(args.child)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
