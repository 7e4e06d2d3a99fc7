"""Reliability rows 20-23: a fleet that heals itself (docs/operations.md, "GPU faults and
notices"), over real processes: agents whose NVML double raises XIDs the way the driver's
event API delivers them, fake engines on their GPUs, the gateway under streaming load,
and a local stand-in for a cloud's metadata service giving a spot notice."""

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from fleet.models import GPU, FleetStatus, Node, Replica, Shard
from tests.agent import nvml_data
from tests.agent.cloud_metadata import CloudMetadata
from tests.e2e.helpers import engine_processes
from tests.processes import Load

pytestmark = pytest.mark.django_db(transaction=True)

FAKE = {"binaries": {"fake": sys.executable}}
CLIENTS = 4


def fake_model(stack, name: str, replicas: int) -> None:
    """A fake-engine model on one GPU per replica, declared through the API."""
    model = stack.api("post", "models/", json={"name": name, "desired_replicas": replicas})
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={
            "model": model["id"],
            "name": "gpu",
            "engine": "fake",
            "model_path": str(stack.tmp / "fake-weights"),  # the fake engine loads nothing
            "gpus_per_node": 1,
            "tp": 1,
        },
    )
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})


def gpu_node(stack, node_id: str, count: int, **config):
    """An agent whose NVML double has ``count`` H100s, running the fake engine."""
    spec = nvml_data.hgx(nvml_data.H100, count=count)
    agent = stack.add_agent(node_id, nvml=spec, engines=FAKE, **config)
    stack.wait(
        lambda: GPU.objects.filter(node_id=node_id).count() == count,
        f"{node_id}'s {count} GPUs to register",
    )
    return agent, spec


def raise_events(agent, spec: dict, *events: tuple[int, int]) -> None:
    """The driver delivers these (GPU index, XID) events on the agent's node: appended to
    the double's log, as the driver raises them."""
    spec.setdefault("events", []).extend({"gpu": i, "type": "xid", "xid": x} for i, x in events)
    path: Path = agent.nvml_file
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec))
    stamp = max(time.time_ns(), path.stat().st_mtime_ns + 1_000_000)
    os.utime(tmp, ns=(stamp, stamp))
    tmp.replace(path)


def serving(stack, name: str, count: int, timeout: float = 120) -> list[Shard]:
    """Wait for ``count`` ready replicas of the model; their shards."""
    stack.wait(
        lambda: Replica.objects.filter(model__name=name, state="ready").count() == count,
        f"{count} ready replica(s) of {name}",
        timeout,
    )
    return list(
        Shard.objects.filter(replica__model__name=name, replica__state="ready").order_by(
            "created_at"
        )
    )


def gpu_of(shard: Shard) -> GPU:
    return GPU.objects.get(node_id=shard.node_id, uuid=shard.gpu_uuids[0])


def replaced(stack, name: str, old: Shard, timeout: float = 120) -> Shard:
    """The ready replica that took ``old``'s place, once ``old`` stopped."""
    before = set(
        Shard.objects.filter(replica__model__name=name, replica__state="ready").values_list(
            "pk", flat=True
        )
    )

    def new_one():
        if Shard.objects.filter(pk=old.pk).exclude(desired_state="stopped").exists():
            return None
        return (
            Shard.objects.filter(replica__model__name=name, replica__state="ready")
            .exclude(pk__in=before | {old.pk})
            .first()
        )

    return stack.wait(new_one, f"{old.pk} replaced", timeout)


def test_gpus_that_fail_under_streams_are_drained_replaced_and_held_until_cleared(stack, record):
    # given: two replicas on a node of eight H100s, four more GPUs beside (the brake lets
    # 3 of 12 be drained at once), clients streaming to the replicas
    agent, spec = gpu_node(stack, "gpu-a", 8)
    fake_model(stack, "m", 2)
    a, b = serving(stack, "m", 2)
    doubles = {"gpu-a": (agent, spec), "gpu-b": gpu_node(stack, "gpu-b", 4)}
    engines = dict(engine_processes(agent.state_dir))

    with Load(stack.url, stack.inference_key, "m", clients=CLIENTS, stream_every=1) as load:
        load.wait_requests(50)
        # when: replica a's GPU falls off the bus, and its engine dies with it
        dead = gpu_of(a)
        raised = time.monotonic()
        raise_events(agent, spec, (dead.index, 79))
        os.kill(engines[a.pk], signal.SIGKILL)
        in_flight_at_fault = CLIENTS  # at most: every client's stream on it at once
        # then: a replacement answers on a healthy GPU; the dead one is held out
        new_a = replaced(stack, "m", a)
        xid79_s = time.monotonic() - raised
        load.wait_requests(50)
        first = load.summary()

        # when: an XID 48 on b's GPU, then an XID 94 on the GPU of a's replacement
        ecc = gpu_of(b)
        raised = time.monotonic()
        raise_events(agent, spec, (ecc.index, 48))
        new_b = replaced(stack, "m", b)
        xid48_s = time.monotonic() - raised
        contained = gpu_of(new_a)
        raised = time.monotonic()
        raise_events(*doubles[contained.node_id], (contained.index, 94))
        newer_a = replaced(stack, "m", new_a)
        xid94_s = time.monotonic() - raised
        load.wait_requests(50)
    figures = load.summary()

    assert GPU.objects.get(pk=dead.pk).health == "failed"
    assert GPU.objects.get(pk=ecc.pk).health == "failed"
    assert GPU.objects.get(pk=contained.pk).health == "degraded"
    survivors = {gpu_of(new_b).pk, gpu_of(newer_a).pk}
    assert survivors.isdisjoint({dead.pk, ecc.pk, contained.pk})
    # only streams the dead GPU held at the instant failed; the rest moved with nothing lost
    assert first["failed"] + first["broken"] <= in_flight_at_fault, first
    later = figures["failed"] + figures["broken"] - first["failed"] - first["broken"]
    assert later == 0, figures

    # and: the failed GPUs take nothing new until an operator clears one
    stack.api("patch", "models/" + str(Replica.objects.first().model_id) + "/",
              json={"desired_replicas": 3})  # fmt: skip
    (third,) = [s for s in serving(stack, "m", 3) if s.pk not in (new_b.pk, newer_a.pk)]
    assert gpu_of(third).pk not in {dead.pk, ecc.pk, contained.pk}
    stack.api("post", f"gpus/{dead.pk}/clear/", json={"reason": "reseated, reset"})
    assert GPU.objects.get(pk=dead.pk).health == "healthy"

    record(
        "20",
        xid79_s=round(xid79_s, 1),
        in_flight=in_flight_at_fault,
        first_failed=first["failed"] + first["broken"],
        first_requests=first["requests"],
        clients=CLIENTS,
    )
    record(
        "21",
        xid48_s=round(xid48_s, 1),
        xid94_s=round(xid94_s, 1),
        later_failed=later,
        later_requests=figures["requests"] - first["requests"],
        clients=CLIENTS,
        rate_per_s=figures["rate_per_s"],
    )


def test_forty_percent_of_the_gpus_failing_at_once_trip_the_brake(stack, record):
    # given: ten GPUs on two nodes, four replicas on the first node's GPUs
    a, a_spec = gpu_node(stack, "gpu-a", 5)
    fake_model(stack, "m", 4)
    shards = serving(stack, "m", 4)
    gpu_node(stack, "gpu-b", 5)

    # when: four of the ten (40 %) fall off the bus in the same second (a driver bug)
    raise_events(a, a_spec, *((gpu_of(s).index, 79) for s in shards))

    # then: three (LLMGW_GPU_FAILURE_BRAKE 0.25 of 10, rounded up) are drained, and the
    # brake holds the fourth
    stack.wait(lambda: FleetStatus.objects.get(pk=1).gpu_brake, "the brake to be on", timeout=60)

    def on_failed_gpus() -> int:
        """Running shards of the model on a failed GPU."""
        failed = set(GPU.objects.filter(health="failed").values_list("node_id", "uuid"))
        running = Shard.objects.filter(replica__model__name="m", desired_state="running")
        return sum(1 for s in running if any((s.node_id, u) in failed for u in s.gpu_uuids))

    stack.wait(
        lambda: (
            Replica.objects.filter(model__name="m", state="ready").count() == 4
            and on_failed_gpus() == 1
        ),
        "three replicas moved",
        timeout=120,
    )
    time.sleep(3)  # passes on the fast clock: nothing more moves
    held = GPU.objects.filter(health="failed", drained_at__isnull=True).count()
    moved = GPU.objects.filter(health="failed", drained_at__isnull=False).count()
    brake = FleetStatus.objects.get(pk=1).gpu_brake
    assert (held, moved) == (1, 3), brake
    assert brake.startswith("4 of 10 GPUs faulted; at most 3 are drained"), brake
    still = on_failed_gpus()
    assert still == 1  # the held GPU's replica still serves
    record("22", failed=4, gpus=10, drained=moved, held=held)


def test_a_spot_notice_of_sixty_seconds_moves_every_replica_before_the_node_goes(stack, record):
    # given: two replicas on a node whose agent asks a stand-in for EC2's metadata
    with CloudMetadata() as cloud:
        notice = {"source": "aws", "url": cloud.url, "poll_interval_s": 0.5}
        gpu_node(stack, "spot", 2, notice=notice)
        fake_model(stack, "m", 2)
        serving(stack, "m", 2)
        gpu_node(stack, "steady", 2)

        with Load(stack.url, stack.inference_key, "m", clients=CLIENTS, stream_every=1) as load:
            load.wait_requests(50)
            # when: EC2 says the instance goes in 60 s
            from django.utils import timezone

            deadline = timezone.now() + timedelta(seconds=60)
            cloud.aws_action = {
                "action": "terminate",
                "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            said = time.monotonic()
            # then: both move to the steady node, and nothing runs on the spot node
            stack.wait(
                lambda: (
                    not Shard.objects.filter(node_id="spot")
                    .exclude(desired_state="stopped")
                    .exists()
                    and Replica.objects.filter(model__name="m", state="ready").count() == 2
                ),
                "the spot node drained",
                timeout=60,
            )
            drained_s = time.monotonic() - said
            load.wait_requests(50)
        figures = load.summary()

    node = Node.objects.get(pk="spot")
    assert node.notice_source == "aws" and node.cordoned
    on = set(
        Shard.objects.filter(replica__model__name="m", replica__state="ready").values_list(
            "node_id", flat=True
        )
    )
    assert on == {"steady"}
    assert drained_s < 60
    assert figures["failed"] == 0 and figures["broken"] == 0, figures
    record("23", notice_s=60, drained_s=round(drained_s, 1), clients=CLIENTS, **figures)
