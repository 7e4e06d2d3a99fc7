"""Console benchmark: the cluster page's server time and queries at 10 and at 1,000 nodes.

    .venv/bin/python bench/console.py                    # SQLite, 10 and 1000 nodes
    .venv/bin/python bench/console.py --levels 10 1000 5000

Each level gets a fresh migrated SQLite database in a scratch state dir,
filled in bulk with nodes as their agents report them (8 × H100 each with its
memory in use, a fresh load, a disk, two engine installs, one ready shard per
node holding one GPU) and one pending replica per ten nodes. It then asks for
the cluster page and for the fragment the page refreshes itself from, as a
logged-in operator through Django's test client (the whole request: session,
middleware, queries, templates), and prints the median server time of 7 and
the number of queries, side by side with the smallest level.

Target (issue 12): 1,000 nodes in under 1 s server time, with the same number
of queries as 10 nodes. Not a timed test: figures for docs/benchmarks.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUNS = 7


def child(nodes: int) -> dict:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")
    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    # Pages name static files through the plain storage: no collectstatic here.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    setup_test_environment()
    call_command("migrate", verbosity=0)
    from tests.console.helpers import simulated_fleet

    t0 = time.perf_counter()
    simulated_fleet(nodes)
    fill_s = time.perf_counter() - t0
    user = get_user_model().objects.create_superuser("bench", password="bench-pw-123")
    client = Client()
    client.force_login(user)
    out = {"nodes": nodes, "fill_s": round(fill_s, 2)}
    for name, url in (("page", "/admin/cluster/"), ("fragment", "/admin/cluster/fragment/")):
        client.get(url)  # warm: templates compiled, connections open
        times = []
        for _ in range(RUNS):
            t = time.perf_counter()
            resp = client.get(url)
            times.append(time.perf_counter() - t)
            assert resp.status_code == 200, resp.status_code
        with CaptureQueriesContext(connection) as ctx:
            body = client.get(url).content
        out[f"{name}_ms"] = round(1000 * statistics.median(times), 1)
        out[f"{name}_queries"] = len(ctx.captured_queries)
        out[f"{name}_kb"] = round(len(body) / 1024)
        out[f"{name}_rows"] = body.count(b'class="node-row')
    return out


def parent(args) -> int:
    from bench._common import machine

    print(f"# console benchmark on SQLite; {machine()}")
    print(
        f"{'nodes':>6} {'rows':>5} {'page ms':>8} {'page q':>7} {'page KiB':>8} "
        f"{'fragment ms':>11} {'fragment q':>10} {'× page ms vs first':>18}"
    )
    first = None
    for level in args.levels:
        work = Path(tempfile.mkdtemp(prefix="llmgw-bench-console-"))
        env = {
            **{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
            "LLMGW_STATE_DIR": str(work),
            "LOG_LEVEL": "WARNING",
        }
        res = subprocess.run(
            [sys.executable, __file__, "--child", str(level)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            print(res.stdout, res.stderr, file=sys.stderr)
            return 1
        r = json.loads(res.stdout.strip().splitlines()[-1])
        first = first or r
        ratio = r["page_ms"] / first["page_ms"] if first["page_ms"] else 0
        print(
            f"{r['nodes']:>6} {r['page_rows']:>5} {r['page_ms']:>8} {r['page_queries']:>7} "
            f"{r['page_kb']:>8} {r['fragment_ms']:>11} {r['fragment_queries']:>10} "
            f"{ratio:>17.2f}×",
            flush=True,
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", nargs="+", type=int, default=[10, 1000])
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
