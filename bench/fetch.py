"""What the agent's fetch costs over a plain download of the same file, side by side.

A local HTTP server in a process of its own (tests/processes/weights_server.py,
1 MiB writes) serves one file of random bytes; each round downloads it three
ways, in turn, to a fresh temporary directory on the same disk:

  plain     urllib, 1 MiB reads, written to a file: the baseline
  fetch     agentd.fetch.Fetcher: HEAD, GET into a .partial file, size check,
            rename of the staging dir, metadata (what every URL fetch does)
  fetch+sha the same with a weights_sha256 for the file (a second pass to hash it)

and a resume: the fetch of a file half of which is already on disk.

    .venv/bin/python bench/fetch.py [--mib 512] [--rounds 3]

Prints one JSON line per round and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentd.fetch import sources, store  # noqa: E402 - after the path is set
from agentd.fetch.fetcher import Fetcher, FetchSettings  # noqa: E402
from tests.processes import weights_server  # noqa: E402


def serve(data_path: str, conn) -> None:
    """The server process: serve the file until told to stop."""
    weights_server.CHUNK = 1 << 20
    srv = weights_server.WeightsServer()
    srv.files["model.gguf"] = Path(data_path).read_bytes()
    conn.send(srv.url("model.gguf"))
    conn.recv()
    srv.close()


def plain(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url) as resp, open(dest, "wb") as out:
        while chunk := resp.read1(1 << 20):
            out.write(chunk)


async def fetch(url: str, root: Path, sha: dict) -> None:
    async def progress(done, total):
        return None

    f = Fetcher(FetchSettings(roots=[root], allow_networks=("127.0.0.0/8",)))
    await f.fetch(sources.parse(url), sha, "bench", progress)


def run_fetch(url: str, root: Path, sha: dict) -> None:
    asyncio.run(fetch(url, root, sha))


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    data = os.urandom(args.mib << 20)
    sha = {"model.gguf": hashlib.sha256(data).hexdigest()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "data").write_bytes(data)
        mine, theirs = multiprocessing.Pipe()
        server = multiprocessing.Process(target=serve, args=(str(Path(tmp) / "data"), theirs))
        server.start()
        url = mine.recv()
        for n in range(args.rounds):
            work = Path(tmp) / str(n)
            work.mkdir()
            runs = [
                ("plain_s", plain, (url, work / "plain.gguf")),
                ("fetch_s", run_fetch, (url, work / "a", {})),
                ("fetch_sha_s", run_fetch, (url, work / "b", sha)),
            ]
            if n % 2:
                runs.reverse()  # the page cache fills as a round writes: no fixed order
            row = {name: timed(fn, *fn_args) for name, fn, fn_args in runs}
            staging = store.staging_dir(work / "c", sources.parse(url))
            staging.mkdir(parents=True)
            (staging / "model.gguf.partial").write_bytes(data[: len(data) // 2])
            row["resume_half_s"] = timed(run_fetch, url, work / "c", {})
            rows.append(row)
            print(json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)
            shutil.rmtree(work)
        mine.send("stop")
        server.join()
    mib = args.mib
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    summary = {k: round(v, 3) for k, v in med.items()}
    summary.update(
        mib=mib,
        plain_mib_s=round(mib / med["plain_s"]),
        fetch_mib_s=round(mib / med["fetch_s"]),
        fetch_sha_mib_s=round(mib / med["fetch_sha_s"]),
    )
    print(json.dumps({"median": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
