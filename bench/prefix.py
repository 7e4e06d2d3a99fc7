"""Prefix-aware routing: time to first token with llama.cpp's prompt cache, and what it costs.

    .venv/bin/python bench/prefix.py [--prefixes 4] [--rounds 12] [--words 200] [--layers 4]

Three measurements, each side by side with least-outstanding in the same run:

1. Time to first token. Four llama.cpp engines (llama-cpp-python's server, as
   the embedded default runs it) serve a generated model bigger than the tests'
   (``--layers`` blocks of 256: prompt processing costs enough to see), two
   replicas for a model with prefix routing on and two for one with it off.
   Each engine keeps its last prompt's KV cache and an LRU of saved states
   (``--cache``) that holds three prompts asked in turn, not four.
   ``--prefixes`` long system prompts (``--words`` words, about 800 tokens at
   200) are asked new questions in turn, round robin, one request at a time,
   each request sent to both models in turn; the client times the first
   streamed event. The engines' own logs say how many prompt tokens they had
   to process.
2. The routing work per request, in process, in CPU time: ``choice.pick`` against the prefix
   hash plus ``choice.pick_prefix``, for a short chat, a chat with a 4 KB system
   prompt and a 16 KB completion prompt, alternating in blocks.
3. The gateway end to end on a fake engine (instant answers), with wrk: a
   model with prefix routing against one without, the same two engines behind
   both, alternating runs, through llmgw as `make run` serves it
   (``python -m llmgw_site.serve``; Daphne before 2026-12-01).

The processes, their environment and wrk are bench/_common.py's, shared with
bench/gateway.py.
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (  # noqa: E402
    PY,
    ROOT,
    Procs,
    free_port,
    gateway_env,
    machine,
    percentile,
    run_setup,
    setup_django,
    start_engine,
    start_gateway,
    wrk,
)
from _common import wait_http as _wait_http  # noqa: E402

ARMS = ("on", "off")  # the model with prefix routing, and the one without
EMBD, FF, CTX = 256, 768, 4096
# Saved states each engine's cache holds. llama-cpp-python's LRU keeps the state a
# hit loaded besides the new one, so a prompt asked again takes two: five hold
# three prompts asked in turn, and not four.
CACHE_STATES = 5


def wait_http(url, proc, timeout=180):
    return _wait_http(url, proc, timeout)


# ---- the database: models, replicas on the engines' ports, a key -----------------


def setup_db(spec: str) -> None:
    """Run in a subprocess: migrate, then the models. ``spec``: JSON {model: [port, ...]}."""
    setup_django()
    from fleet.models import (
        ApiKey,
        DesiredState,
        Engine,
        EngineProfile,
        Model,
        Node,
        Replica,
        ReplicaState,
        Shard,
        ShardState,
    )

    for name, ports in json.loads(spec).items():
        model = Model.objects.create(
            name=name, desired_replicas=len(ports), prefix_routing=name.endswith("-on")
        )
        profile = EngineProfile.objects.create(
            model=model, name="bench", engine=Engine.FAKE, model_path="/none", served_model_name=""
        )
        for i, port in enumerate(ports):
            node, _ = Node.objects.get_or_create(
                pk=f"bench-{name}-{i}", defaults={"mgmt_addr": "127.0.0.1", "connected": True}
            )
            # Fixed replica ids: the ring, and so the prefixes' owners, are the same every run.
            replica = Replica.objects.create(
                id=f"{name}-{i}", model=model, profile=profile, state=ReplicaState.READY
            )
            Shard.objects.create(
                replica=replica,
                node=node,
                port=port,
                state=ShardState.READY,
                desired_state=DesiredState.RUNNING,
            )
    _, secret = ApiKey.issue(name="bench", scope="inference")
    print(secret)


# ---- 1. time to first token ------------------------------------------------------


def system_prompts(n: int, words: int) -> list[str]:
    from agentd.tinygguf import WORDS

    out = []
    for i in range(n):
        rng = random.Random(1000 + i)
        out.append(f"System prompt {i}. " + " ".join(rng.choice(WORDS) for _ in range(words)))
    return out


def first_event(port: int, key: str, body: dict) -> tuple[float, str]:
    """Seconds to the first streamed event, and the replica the gateway chose."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    conn.request(
        "POST",
        "/v1/chat/completions",
        data,
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{resp.status}: {resp.read()[:300]!r}")
    replica = resp.getheader("x-llmgw-replica", "?")
    while True:
        line = resp.readline()
        if not line:
            raise RuntimeError("the stream ended before any event")
        if line.startswith(b"data:"):
            ttft = time.perf_counter() - t0
            break
    resp.read()  # the rest, so the engine is free for the next request
    conn.close()
    return ttft, replica


_EVAL = re.compile(r"prompt eval time =\s+[\d.]+ ms /\s+(\d+) tokens")


def prompt_tokens_evaluated(log: Path) -> int:
    return sum(int(m.group(1)) for m in _EVAL.finditer(log.read_text(errors="replace")))


_VOCAB = None


def state_bytes(model: Path, text: str, layers: int) -> int:
    """About what llama.cpp saves for a prompt of ``text``: K and V, f16, every layer."""
    from llama_cpp import Llama

    global _VOCAB
    vocab = _VOCAB = _VOCAB or Llama(model_path=str(model), vocab_only=True, verbose=False)
    tokens = len(vocab.tokenize(text.encode())) + 40  # the chat template and the question
    return tokens * layers * EMBD * 2 * 2


def ttft_run(args, work: Path, procs: Procs, env: dict) -> dict:
    from agentd.tinygguf import write as write_tiny_model

    model = write_tiny_model(work / "bench.gguf", layers=args.layers, embd=EMBD, ff=FF, ctx=CTX)
    prompts = system_prompts(args.prefixes, args.words)
    cache = int((CACHE_STATES + 0.5) * max(state_bytes(model, t, args.layers) for t in prompts))
    engines = {arm: [] for arm in ARMS}
    for arm in ARMS:
        for i in range(2):
            port = free_port()
            name = f"llama-{arm}-{i}"
            proc = procs.start(
                name,
                [PY, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1"]
                + ["--port", str(port), "--model_alias", f"pfx-{arm}", "--n_ctx", str(CTX)]
                + (["--cache", "true", "--cache_size", str(cache)] if args.cache else []),
                env,
            )
            engines[arm].append((port, proc, work / f"{name}.log"))
    for arm in ARMS:
        for port, proc, _ in engines[arm]:
            wait_http(f"http://127.0.0.1:{port}/v1/models", proc)
    spec = {f"pfx-{arm}": [p for p, _, _ in engines[arm]] for arm in ARMS}
    key = run_setup(__file__, json.dumps(spec), env)[-1]
    gw_port, _ = start_gateway(procs, env)

    rng = random.Random(7)
    rows = []
    n = 0
    for r in range(args.rounds):
        # Round robin through the prompts: an engine's cache then holds every
        # prompt that comes to it, if no more than three do.
        for p in range(args.prefixes):
            question = f"Question {n}: " + " ".join(
                rng.choice(["why", "how", "when"]) for _ in range(5)
            )
            arms = ARMS if n % 2 == 0 else ARMS[::-1]
            for arm in arms:
                body = {
                    "model": f"pfx-{arm}",
                    "max_tokens": 2,
                    "stream": True,
                    "temperature": 0,
                    "messages": [
                        {"role": "system", "content": prompts[p]},
                        {"role": "user", "content": question},
                    ],
                }
                ttft, replica = first_event(gw_port, key, body)
                rows.append(
                    {"round": r, "prefix": p, "arm": arm, "ttft_s": ttft, "replica": replica}
                )
            n += 1
    result = {
        "prefixes": args.prefixes,
        "rounds": args.rounds,
        "cache_bytes": cache,
        "arms": {},
        "requests": rows,
    }
    for arm in ARMS:
        mine = [row for row in rows if row["arm"] == arm]
        warm = [row["ttft_s"] for row in mine if row["round"] > 0]
        spread = {}
        for row in mine:
            spread.setdefault(row["prefix"], set()).add(row["replica"])
        result["arms"][arm] = {
            "requests": len(mine),
            "ttft_mean_ms": 1000 * sum(row["ttft_s"] for row in mine) / len(mine),
            "ttft_p50_ms": 1000 * percentile([row["ttft_s"] for row in mine], 50),
            "ttft_p90_ms": 1000 * percentile([row["ttft_s"] for row in mine], 90),
            "after_first_round_mean_ms": 1000 * sum(warm) / max(1, len(warm)),
            "after_first_round_p50_ms": 1000 * percentile(warm, 50),
            "prompt_tokens_evaluated": sum(
                prompt_tokens_evaluated(log) for _, _, log in engines[arm]
            ),
            "replicas_per_prefix": {p: sorted(s) for p, s in sorted(spread.items())},
        }
    return result


# ---- 2. the routing work, in process ---------------------------------------------


def cpu_timer(fn) -> list[float]:
    return timeit.repeat(fn, number=20000, repeat=3, timer=time.process_time)


def micro(out_path: str) -> None:
    """Run in a subprocess with the bench's environment: µs per request for each way of picking."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    django.setup()
    from fleet.gateway import choice, prefix, table

    policy = prefix.Policy(load_factor=1.25, margin=8, max_outstanding=256)
    long_system = " ".join(system_prompts(1, 700)[0].split()[:700])[:4096]
    bodies = {
        "chat, short": {"messages": [{"role": "user", "content": "hi"}]},
        "chat, 4 KB system prompt": {
            "messages": [
                {"role": "system", "content": long_system},
                {"role": "user", "content": "What is the capital of France?"},
            ]
        },
        "completions, 16 KB prompt": {"prompt": (long_system + " ") * 4},
    }
    results = {}
    for n_rep in (2, 8):
        views = [
            table.ReplicaView(
                f"r{i}",
                1,
                "ready",
                "",
                "m",
                (table.ShardView(0, "ready", "running", "n", "h", 8000 + i, "ready"),),
            )
            for i in range(n_rep)
        ]
        on = table.build_routes([table.ModelView(1, "m", 0, n_rep, True)], views)["m"]
        off = table.build_routes([table.ModelView(1, "m", 0, n_rep, False)], views)["m"]
        for i, u in enumerate(on.upstreams):
            u.outstanding = i % 3
        for i, u in enumerate(off.upstreams):
            u.outstanding = i % 3
        for name, body in bodies.items():
            endpoint = "completions" if "prompt" in body else "chat/completions"

            def least(off=off):
                choice.pick(off, ())

            def by_prefix(on=on, endpoint=endpoint, body=body):
                choice.pick_prefix(on, prefix.key_of(endpoint, body, 1024), policy, ())

            off_t, on_t = [], []
            # Alternating blocks, so the machine's moods hit both; CPU time of this
            # process, so its neighbours' runs do not count as the code's.
            for _ in range(5):
                off_t.append(min(cpu_timer(least)) / 20000)
                on_t.append(min(cpu_timer(by_prefix)) / 20000)
            results[f"{name}, {n_rep} replicas"] = {
                "least_outstanding_us": 1e6 * min(off_t),
                "prefix_us": 1e6 * min(on_t),
            }
        start = time.process_time()
        for _ in range(100):
            prefix.Ring(on.upstreams)
        results[f"ring build, {n_rep} replicas"] = {
            "ms": 1000 * (time.process_time() - start) / 100
        }
    Path(out_path).write_text(json.dumps(results))


# ---- 3. the gateway end to end -----------------------------------------------------


def overhead_run(args, work: Path, procs: Procs, env: dict) -> dict:
    ports = [start_engine(procs, env, f"fake-{i}", "x")[0] for i in range(2)]
    key = run_setup(__file__, json.dumps({"fake-on": ports, "fake-off": ports}), env)[-1]
    gw_port, _ = start_gateway(procs, env)
    system = system_prompts(1, 700)[0][:4096]
    out = {}
    for conc in (1, 16):
        runs = {arm: [] for arm in ARMS}
        for i in range(args.overhead_rounds):
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                payload = {
                    "model": f"fake-{arm}",
                    "max_tokens": 1,
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"question {i}"},
                    ],
                }
                runs[arm].append(
                    wrk(
                        f"http://127.0.0.1:{gw_port}/v1/chat/completions",
                        payload,
                        key,
                        conc,
                        args.duration,
                        work,
                    )
                )
        out[f"c={conc}"] = {
            arm: {
                "p50_ms": sorted(r["p50_ms"] for r in rs)[len(rs) // 2],
                "p99_ms": sorted(r["p99_ms"] for r in rs)[len(rs) // 2],
                "rps": sorted(r["rps"] for r in rs)[len(rs) // 2],
                "non_2xx": sum(r["non_2xx"] for r in rs),
            }
            for arm, rs in runs.items()
        }
    return out


# ---- the run ---------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefixes", type=int, default=4, help="distinct system prompts")
    p.add_argument("--rounds", type=int, default=12, help="questions per system prompt")
    p.add_argument("--words", type=int, default=200, help="words per system prompt")
    p.add_argument("--layers", type=int, default=4, help="blocks of the generated model")
    p.add_argument("--no-cache", dest="cache", action="store_false", help="no state cache")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    p.add_argument("--overhead-rounds", type=int, default=4, help="wrk runs per arm")
    p.add_argument("--only", help="comma-separated: ttft, micro, overhead")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "prefix.json"))
    p.add_argument("--setup-db", help=argparse.SUPPRESS)
    p.add_argument("--micro", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.setup_db:
        setup_db(args.setup_db)
        return 0
    if args.micro:
        micro(args.micro)
        return 0
    only = set((args.only or "ttft,micro,overhead").split(","))
    results: dict = {"machine": machine(), "load1_start": os.getloadavg()[0]}
    for part in ("ttft", "micro", "overhead"):
        if part not in only:
            continue
        work = Path(tempfile.mkdtemp(prefix=f"llmgw-bench-prefix-{part}-"))
        procs = Procs(work)
        env, redis = gateway_env(work, work.name)
        try:
            if part == "ttft":
                results["ttft"] = ttft_run(args, work, procs, env)
            elif part == "micro":
                out = work / "micro.json"
                subprocess.run([PY, __file__, "--micro", str(out)], env=env, cwd=ROOT, check=True)
                results["micro"] = json.loads(out.read_text())
            else:
                results["overhead"] = overhead_run(args, work, procs, env)
        finally:
            procs.stop_all()
            if redis is not None:
                redis.stop()
        print(f"{part}: done (logs in {work})", file=sys.stderr)
    results["load1_end"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    report(results)
    return 0


def report(results: dict) -> None:
    load = f"{results['load1_start']:.1f} → {results['load1_end']:.1f}"
    print(f"machine: {results['machine']}; load {load}")
    if "ttft" in results:
        t = results["ttft"]
        print(
            f"\ntime to first token, {t['prefixes']} system prompts × {t['rounds']} questions, "
            "one request at a time, the same sequence to both models:"
        )
        print(f"  {'':22} {'mean':>8} {'p50':>8} {'p90':>8} {'mean r>0':>9} {'prompt tokens':>14}")
        for arm, r in t["arms"].items():
            label = "prefix-aware" if arm == "on" else "least-outstanding"
            print(
                f"  {label:22} {r['ttft_mean_ms']:7.0f}  {r['ttft_p50_ms']:7.0f}  "
                f"{r['ttft_p90_ms']:7.0f}  {r['after_first_round_mean_ms']:8.0f}  "
                f"{r['prompt_tokens_evaluated']:13d}"
            )
            print(f"  {'':22} replicas per prompt: {r['replicas_per_prefix']}")
    if "micro" in results:
        print("\nrouting work per request, in process (µs of CPU):")
        for name, r in results["micro"].items():
            if "ms" in r:
                print(f"  {name:40} {r['ms']:.3f} ms")
                continue
            off, on = r["least_outstanding_us"], r["prefix_us"]
            print(f"  {name:40} least-outstanding {off:.2f}  prefix {on:.2f}  (+{on - off:.2f})")
    if "overhead" in results:
        print("\nthrough the gateway on a fake engine, 4 KB system prompt (wrk, median of runs):")
        for conc, arms in results["overhead"].items():
            on, off = arms["on"], arms["off"]
            print(
                f"  {conc:5} p50 {off['p50_ms']:.2f} → {on['p50_ms']:.2f} ms "
                f"({on['p50_ms'] - off['p50_ms']:+.2f}); "
                f"p99 {off['p99_ms']:.2f} → {on['p99_ms']:.2f}; "
                f"req/s {off['rps']:.0f} → {on['rps']:.0f}; "
                f"non-2xx {off['non_2xx'] + on['non_2xx']}"
            )


if __name__ == "__main__":
    sys.exit(main())
