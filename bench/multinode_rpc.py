"""llama.cpp over two nodes (RPC), directly and through the follower's relay, against the
same model on one node, side by side.

    .venv/bin/python bench/multinode_rpc.py [--rounds 6] [--tokens 64] [--layers 8] [--bin DIR]

The engines are the ones a node's agent installs (agentd.install: llama-cpp-python
and the llama-server and ggml-rpc-server built from its llama.cpp, from the build
cache when warm), installed here into bench/out/multinode-env; ``--bin DIR`` takes
llama-server and ggml-rpc-server from DIR instead (``.venv/bin``, which ``make
venv`` builds the same way). A generated model bigger than the tests' (``--layers``
blocks of 256 wide) is served three ways:

- one node: ``llama-server`` alone, the layers on its own CPU;
- two nodes: ``ggml-rpc-server`` (the follower) and ``llama-server --rpc
  --n-gpu-layers all`` (the leader), the layers on the follower, over loopback TCP;
- two nodes through the relay: the same, with the follower's ``ggml-rpc-server`` on
  127.0.0.1 behind ``agentd/rpcrelay.py``, which lets only the leader's address
  through, exactly as a two-node replica runs now (docs/security.md, "rpc-server").

Each round asks each arm for ``--tokens`` tokens (a completion, one at a time;
the arms alternate), and the engine's own timings give decode tokens/s. The
figure over loopback on one machine shows the RPC protocol's cost and the
relay's, not a network's; across real nodes the follower's own GPU does the work
and each token also crosses the network.
"""

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import OUT, PY, Procs, free_port, machine  # noqa: E402

from agentd import rpcrelay  # noqa: E402

EMBD, FF, CTX = 256, 512, 1024


def install(root: Path) -> Path:
    """The agent's own install of llama.cpp (tools included); its environment."""
    from agentd.engineconfig import InstallConfig
    from agentd.install import INSTALLED, Installer, Want

    text = (Path(__file__).resolve().parent.parent / "requirements.txt").read_text()
    version = next(
        ln.split("==")[1].strip() for ln in text.splitlines() if ln.startswith("llama-cpp-python")
    )
    started = time.monotonic()
    (status,) = asyncio.run(
        Installer(root, InstallConfig()).converge([Want("llamacpp", version)], [])
    )
    if status.state != INSTALLED:
        sys.exit(f"llama.cpp did not install: {status.detail}")
    print(f"llama.cpp {version} installed in {time.monotonic() - started:.1f} s", flush=True)
    return Path(status.binary).parent


def wait_health(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"llama-server on {port} did not become healthy")


def wait_listening(port: int, timeout: float = 60) -> None:
    """Until something accepts on the port (as the leader's rpcwait.py waits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def complete(port: int, tokens: int) -> dict:
    body = json.dumps(
        {"prompt": "the fleet", "n_predict": tokens, "ignore_eos": True, "cache_prompt": False}
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["timings"]


ARMS = ("one node", "two nodes (RPC)", "two nodes (RPC, relay)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--bin", type=Path, help="llama-server and ggml-rpc-server from here")
    args = ap.parse_args()
    from agentd.tinygguf import write as write_model

    work = OUT / "multinode"
    work.mkdir(parents=True, exist_ok=True)
    env_bin = args.bin.resolve() if args.bin else install(OUT / "multinode-env")
    model = write_model(work / "bench.gguf", layers=args.layers, embd=EMBD, ff=FF, ctx=CTX)
    server, rpc = str(env_bin / "llama-server"), str(env_bin / "ggml-rpc-server")
    common = ["-m", str(model), "--host", "127.0.0.1", "-c", str(CTX), "-t", "1"]
    procs = Procs(work)
    try:
        ports = {arm: free_port() for arm in ARMS}
        direct, relayed = free_port(), free_port()
        procs.start("one-node", [server, *common, "--port", str(ports[ARMS[0]])], None)
        procs.start("follower", [rpc, "-H", "127.0.0.1", "-p", str(direct), "-t", "1"], None)
        # As a follower shard runs it (agentd.engines.llamacpp): the relay by its path, the
        # rpc-server on a loopback port it picks, only the leader's address let through.
        procs.start(
            "follower-relay",
            [PY, rpcrelay.__file__, "--host", "127.0.0.1", "--port", str(relayed),
             "--allow", "127.0.0.1", "--", rpc, "-H", "127.0.0.1", "-p", "{port}", "-t", "1"],
            None,
        )  # fmt: skip
        wait_listening(direct)
        wait_listening(relayed)
        for name, arm, follower in (
            ("leader", ARMS[1], direct),
            ("leader-relay", ARMS[2], relayed),
        ):
            procs.start(
                name,
                [server, *common, "--port", str(ports[arm]), "--rpc", f"127.0.0.1:{follower}",
                 "--n-gpu-layers", "all"],
                None,
            )  # fmt: skip
        for port in ports.values():
            wait_health(port)
        rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm in ARMS:
                rates[arm].append(complete(ports[arm], args.tokens)["predicted_per_second"])
    finally:
        procs.stop_all()
    base, rpc_base = (statistics.median(rates[a]) for a in ARMS[:2])
    print(f"\n{machine()}; model: {args.layers} layers × {EMBD}, {args.tokens} tokens a request")
    print(
        f"| arm | decode tokens/s (median of {args.rounds}) | min – max | against one node "
        "| against RPC direct |"
    )
    print("| --- | --- | --- | --- | --- |")
    for arm, got in rates.items():
        med = statistics.median(got)
        print(
            f"| {arm} | {med:.0f} | {min(got):.0f} – {max(got):.0f} | {med / base:.2f}× "
            f"| {med / rpc_base:.2f}× |"
        )


if __name__ == "__main__":
    main()
