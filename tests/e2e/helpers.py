"""The e2e scenarios' vocabulary: declare a model through the API, find what runs, ask the
gateway, count reconciler passes. The processes themselves are ``tests.processes.Stack``."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.processes import Stack, free_port


@contextmanager
def batch_stack(tmp: Path, **clock: str) -> Iterator[Stack]:
    """The e2e stack with keys, its control plane started, its workers sending batch
    lines to its own web process (a port chosen first, kept across restarts)."""
    s = Stack(tmp, **clock)
    s.port = free_port()
    s.env["LLMGW_BATCH_GATEWAY_URL"] = f"http://127.0.0.1:{s.port}"
    try:
        s.make_keys()
        s.start_control_plane()
        yield s
    finally:
        s.close()


def apply_model(
    stack: Stack,
    path: Path,
    name: str = "tiny-llama",
    replicas: int = 1,
    profile_fields: dict | None = None,
    **fields,
) -> int:
    """Declare a llama.cpp CPU model through the DRF API, as an operator's script would.

    ``fields``: more of the model's fields, e.g. ``placement_policy="spread"``;
    ``profile_fields`` more of its profile's.
    """
    model = stack.api(
        "post", "models/", json={"name": name, "desired_replicas": replicas, **fields}
    )
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={
            "model": model["id"],
            "name": "cpu",
            "engine": "llamacpp",
            "model_path": str(path),
            **(profile_fields or {}),
        },
    )
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})
    return model["id"]


def live_shards(name: str = "tiny-llama"):
    """Shards of the model that should be running, oldest first."""
    from fleet.models import Shard

    return list(
        Shard.objects.filter(replica__model__name=name, desired_state="running").order_by(
            "created_at"
        )
    )


def ready_shards(name: str = "tiny-llama"):
    """Running shards of ready replicas."""
    return [s for s in live_shards(name) if s.replica.state == "ready" and s.state == "ready"]


def answers(stack: Stack, name: str = "tiny-llama") -> str | None:
    """A non-streamed chat completion through the gateway, or None if it failed."""
    import openai

    try:
        reply = stack.openai(timeout=30).chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
    except openai.APIError:
        return None
    return reply.choices[0].finish_reason


def wait_serving(stack: Stack, name: str = "tiny-llama", count: int = 1, timeout: float = 120):
    """Wait until ``count`` replicas are ready and the gateway answers; returns their shards."""
    shards = stack.wait(
        lambda: (s := ready_shards(name)) and len(s) == count and s,
        f"{count} ready replica(s) of {name}",
        timeout,
    )
    stack.wait(lambda: answers(stack, name), f"the gateway to answer for {name}")
    return shards


def passes() -> int:
    """Reconciler passes run so far (FleetStatus)."""
    from fleet.models import FleetStatus

    status = FleetStatus.objects.filter(pk=1).first()
    return status.passes if status else 0


def wait_passes(stack: Stack, count: int) -> None:
    """Wait until the reconciler has run ``count`` more passes, so what they would do is done."""
    target = passes() + count
    stack.wait(lambda: passes() >= target, f"{count} more reconciler passes")


def engine_processes(state_dir: Path) -> list[tuple[str, int]]:
    """Every engine group leader carrying this agent's mark, as (shard id, PID), duplicates kept.

    ``Agent.engines()`` maps shard id to one PID, so it would hide a second copy
    of the same shard; this list does not.
    """
    import os

    from agentd import state

    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = state.environ(pid)
        if not env or env.get(state.MARK_STATE_DIR) != str(state_dir):
            continue
        if state.MARK_SHARD in env and state.process_group(pid) == pid:
            found.append((env[state.MARK_SHARD], pid))
    return sorted(found)


def engine_starts(stack: Stack) -> int:
    """Engines the agents have started, counted from their logs ("shard …: started …")."""
    import re

    started = re.compile(r"shard \S+: started \S+ as pid")
    return sum(
        len(started.findall(log.read_text(errors="replace")))
        for agent in stack.agents
        for log in agent.logs()
    )


def duplicate_shards(name: str = "tiny-llama") -> int:
    """Running shards beyond one per replica of the model (a single-node profile)."""
    from collections import Counter

    per_replica = Counter(s.replica_id for s in live_shards(name))
    return sum(n - 1 for n in per_replica.values())
