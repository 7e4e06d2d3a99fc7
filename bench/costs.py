"""Cost benchmark: a month of hourly attribution over a fleet, and the report's queries.

    .venv/bin/python bench/costs.py                                  # SQLite
    .venv/bin/python bench/costs.py --pg postgres://postgres@127.0.0.1:5432
    .venv/bin/python bench/costs.py --levels 500 5000 --hours 720

Each level (nodes, each of 8 H100s) gets a fresh migrated database and a
process of its own, filled in bulk as a fleet that is serving: 200 models of 20
teams; on each node two replicas on two whole GPUs each, one on one GPU, two
sharing a GPU (40 GiB each) and two GPUs idle (five shards a node); every
model's tokens in every hour of the month (KeyUsage, one key per team). The H100
price changes once, mid-month. Then, in the same process:

- tick: one count as beat runs it every minute (``accrue``: read the inventory,
  attribute, upsert the hour's rows, price them, the teams' spending), median
  of 7, with nothing to close;
- hour: a month of counts, one per hour (LLMGW_COST_GAP_MAX_S raised to allow it), each
  adding an hour and closing the one before (tokens from KeyUsage, priced,
  closed): each call's time, median and worst; "per hour closed" is what beat
  spends on an hour at its real cadence, 60 ticks and one close;
- report: ``report`` over the month by team and model, its queries and time
  (the cost page's and the API's read): the queries must not grow with the fleet.
"""

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LEVELS = ["500", "5000"]
MODELS = 200
TEAMS = 20
RUNS = 7


def parent(args) -> int:
    from bench._common import Levels, machine, write_json

    results = []
    with Levels(__file__, pg=args.pg, name="llmgw_bench_costs") as levels:
        print(f"# cost benchmark on {levels.kind}; {machine()}")
        print(
            f"{'nodes':>6} {'GPUs':>6} {'shards':>6} {'tick ms':>8} {'close ms':>9} "
            f"{'worst':>7} {'per hour closed s':>17} {'rows':>7} {'report ms':>9} "
            f"{'queries':>7}"
        )
        for level in args.levels:
            r = levels.run(level, LLMGW_COST_GAP_MAX_S="7200", BENCH_HOURS=str(args.hours))
            results.append(r)
            print(
                f"{r['nodes']:>6} {r['gpus']:>6} {r['shards']:>6} {r['tick_ms']:>8.0f} "
                f"{r['hour_ms']:>9.0f} {r['hour_worst_ms']:>7.0f} "
                f"{r['per_hour_closed_s']:>17.1f} {r['rows']:>7} {r['report_ms']:>9.0f} "
                f"{r['report_queries']:>7}",
                flush=True,
            )
            print(
                f"#   {r['hours']} hours counted in {r['month_s']:.0f} s; the month adds up: "
                f"{r['fleet_gpu_hours']:.0f} GPU-hours = {r['gpus']} GPUs x {r['hours']} h, "
                f"{r['fleet_cost']:.2f} USD (expected {r['expected_cost']:.2f})"
            )
    write_json(args.json, results)
    return 0


def child(level: str) -> None:
    import os
    from datetime import UTC, datetime, timedelta
    from decimal import Decimal

    from bench._common import django_child, timed

    django_child()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.models import GPU, CostHour, FleetStatus, Shard
    from fleet.services import costs

    n_nodes = int(level)
    hours = int(os.environ.get("BENCH_HOURS", "720"))
    start = datetime(2026, 11, 1, tzinfo=UTC)
    populate(n_nodes, start, hours)
    half = start + timedelta(hours=hours // 2)
    costs.set_price("H100", Decimal("2.00"), "USD", start - timedelta(days=1))
    costs.set_price("H100", Decimal("2.50"), "USD", half)
    gpus = GPU.objects.count()

    # The month, one count an hour: each adds the hour before and closes the one before it.
    FleetStatus.objects.update_or_create(pk=1, defaults={"cost_accrued_at": start})
    per_hour = []
    t0 = time.perf_counter()
    for h in range(1, hours + 2):
        ms, _, _ = timed(lambda h=h: costs.accrue(start + timedelta(hours=h, seconds=31)))
        per_hour.append(ms)
    month_s = time.perf_counter() - t0
    end = start + timedelta(hours=hours)
    closed = CostHour.objects.filter(hour__lt=end, closed=True).values("hour").distinct().count()
    assert closed == hours, (closed, hours)

    # A tick as beat runs it every minute, in the hour under way: nothing to close.
    at = start + timedelta(hours=hours + 1, minutes=1)
    ticks = []
    for i in range(RUNS):
        ms, _, _ = timed(lambda i=i: costs.accrue(at + timedelta(minutes=i)))
        ticks.append(ms)

    with CaptureQueriesContext(connection) as queries:
        ms_report, _, got = timed(lambda: costs.report(start, end))
    [total] = got.totals
    expected = gpus * (hours // 2) * 2.0 + gpus * (hours - hours // 2) * 2.5
    out = {
        "database": connection.vendor,
        "nodes": n_nodes,
        "gpus": gpus,
        "shards": Shard.objects.count(),
        "hours": hours,
        "tick_ms": statistics.median(ticks),
        "hour_ms": statistics.median(per_hour),
        "hour_worst_ms": max(per_hour),
        "per_hour_closed_s": (60 * statistics.median(ticks) + statistics.median(per_hour)) / 1000,
        "month_s": month_s,
        "rows": CostHour.objects.count(),
        "report_ms": ms_report,
        "report_queries": len(queries.captured_queries),
        "report_rows": len(got.rows),
        "fleet_gpu_hours": total.gpu_hours,
        "fleet_cost": float(total.cost),
        "expected_cost": expected,
    }
    assert abs(total.gpu_hours - gpus * hours) < 1e-6 * gpus * hours, out
    assert abs(float(total.cost) - expected) < 0.01 * hours, out
    print(json.dumps(out))


def populate(n_nodes: int, start, hours: int) -> None:
    """A serving fleet, in bulk: no signal, no pass, while it is built."""
    from datetime import timedelta

    from django.contrib.auth.models import Group

    from fleet.models import (
        GPU,
        ApiKey,
        EngineProfile,
        KeyUsage,
        Model,
        Node,
        Replica,
        Shard,
        Team,
    )

    Node.objects.bulk_create(
        (Node(id=f"gpu-{i:05d}", state="ready", memory_total_mb=2_000_000) for i in range(n_nodes)),
        batch_size=2000,
    )
    GPU.objects.bulk_create(
        (
            GPU(
                node_id=f"gpu-{i:05d}",
                index=g,
                uuid=f"GPU-{i:05d}-{g}",
                name="NVIDIA H100 80GB HBM3",
                memory_total_mb=81559,
            )
            for i in range(n_nodes)
            for g in range(8)
        ),
        batch_size=5000,
    )
    groups = Group.objects.bulk_create(Group(name=f"team-{t:02d}") for t in range(TEAMS))
    teams = Team.objects.bulk_create(Team(name=g.name, group=g) for g in groups)
    models = Model.objects.bulk_create(
        Model(name=f"model-{m:03d}", team=teams[m % TEAMS]) for m in range(MODELS)
    )
    whole = EngineProfile.objects.bulk_create(
        EngineProfile(model=m, name="h100", engine="vllm", model_path=f"/m/{m.name}", tp=2)
        for m in models
    )
    shared = EngineProfile.objects.bulk_create(
        EngineProfile(
            model=m, name="share", engine="vllm", model_path=f"/m/{m.name}", gpu_memory_gb=40
        )
        for m in models
    )
    # Per node: GPUs 0-1 and 2-3 whole, 4 whole, 5 shared by two, 6-7 idle.
    layout = [((0, 1), whole), ((2, 3), whole), ((4,), whole), ((5,), shared), ((5,), shared)]
    plan = [
        (i, k, gpus, profiles) for i in range(n_nodes) for k, (gpus, profiles) in enumerate(layout)
    ]
    replicas = Replica.objects.bulk_create(
        (
            Replica(
                model=models[(i * 5 + k) % MODELS], profile=p[(i * 5 + k) % MODELS], state="ready"
            )
            for i, k, _, p in plan
        ),
        batch_size=2000,
    )
    Shard.objects.bulk_create(
        (
            Shard(
                replica=r,
                node_id=f"gpu-{i:05d}",
                gpu_uuids=[f"GPU-{i:05d}-{g}" for g in gpus],
                port=8000 + k,
                state="ready",
                desired_state="running",
            )
            for r, (i, k, gpus, _) in zip(replicas, plan, strict=True)
        ),
        batch_size=2000,
    )
    keys = ApiKey.objects.bulk_create(
        ApiKey(name=f"key-{t.name}", prefix=f"p{n:07d}", secret_hash=f"{n:064x}", team=t)
        for n, t in enumerate(teams)
    )
    KeyUsage.objects.bulk_create(
        (
            KeyUsage(
                key=keys[m % TEAMS],
                model=f"model-{m:03d}",
                hour=start + timedelta(hours=h),
                requests=100,
                prompt_tokens=200_000,
                completion_tokens=50_000,
            )
            for h in range(hours + 1)
            for m in range(MODELS)
        ),
        batch_size=5000,
    )


def main() -> int:
    from bench._common import level_args

    parser = level_args(__doc__, LEVELS, "NODES")
    parser.add_argument("--hours", type=int, default=720, help="hours in the month counted")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    return parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
