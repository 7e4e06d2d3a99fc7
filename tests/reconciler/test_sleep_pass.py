"""Sleep and wake inside reconciler passes (docs/operations.md, "Sleep and wake"): the
gateways' reports in (real Redis), what each shard is told and why out. Time is passed in
as ``now``; nothing sleeps."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group

from fleet.models import Event, EventKind, Model, ReplicaState, Team
from fleet.services.autoscaler import load
from fleet.services.desired import desired_set
from fleet.services.estimate import estimate_key
from fleet.services.placement import explain
from fleet.services.snapshot import build, request_for
from tests.factories import H100_GPUS, add_model, add_node
from tests.reconciler.helpers import Clock, make_ready, replicas, report, running, shards_of

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_reports():
    load.forget()
    yield
    load.forget()


def one_h100(node_id="gpu-01", memory_gb=256):
    add_node(node_id, gpus=[{**H100_GPUS[0], "uuid": f"GPU-{node_id}-0"}], memory_gb=memory_gb)


def sleepy(name, gb=50, prio=0, after=60, level=1, **fields):
    """A model that sleeps after ``after`` s idle, on a share of ``gb`` GB of one GPU:
    at 50 GB an H100 holds one awake."""
    model = add_model(name, engine="vllm", gpus_per_node=1, tp=1, gpu_memory_gb=gb)
    model.sleep_after_s, model.sleep_level, model.priority = after, level, prio
    for k, v in fields.items():
        setattr(model, k, v)
    model.full_clean()
    model.save()
    return model


def gateway_reports(clock, **models):
    """A gateway's report now: model=(in flight, waiting, seconds since its last request)."""
    now = clock.now.timestamp()
    load.write(
        "gw-1",
        {name: [f, w, now - ago] for name, (f, w, ago) in models.items()},
        now=now,
    )


def asleep(model):
    for s in shards_of(model, desired_state="asleep"):
        if s.state != "asleep":
            report(s, "asleep")


def fallen_asleep(model, idle_s=120) -> Clock:
    """The model placed, ready, then idle ``idle_s`` (past its sleep_after_s) and asleep,
    as its node reports it; the clock of those passes."""
    clock = Clock()
    clock.pass_()
    make_ready(model)
    clock.pass_()
    clock.now += timedelta(seconds=idle_s)
    gateway_reports(clock, **{model.name: (0, 0, idle_s)})
    clock.pass_()
    asleep(model)
    return clock


def test_an_idle_model_sleeps_and_a_waiting_request_wakes_it():
    one_h100()
    model = sleepy("qwen", after=60)
    clock = Clock()
    clock.pass_()
    [shard] = running(model)
    # started ready to sleep through vLLM's API
    [spec] = desired_set("gpu-01").shards
    assert spec.sleep_level == 1
    make_ready(model)
    clock.pass_()

    # when: no request for 55 s, then 65 s
    clock.now += timedelta(seconds=55)
    gateway_reports(clock, qwen=(0, 0, 55))
    assert clock.pass_().slept == 0
    clock.now += timedelta(seconds=10)
    gateway_reports(clock, qwen=(0, 0, 65))
    got = clock.pass_()

    # then: its replica goes to sleep, the agent is told, and the event says why
    assert got.slept == 1
    [r] = replicas(model)
    assert r.state == ReplicaState.ASLEEP
    assert r.reason == "asleep: no request for 65 s (sleep after 60 s)"
    assert [s.state for s in desired_set("gpu-01").shards] == ["asleep"]
    [event] = Event.objects.filter(kind=EventKind.SLEEP)
    assert event.model_name == "qwen" and "going to sleep: no request for 65 s" in event.reason

    # when: its node says it sleeps, and a request waits at a gateway
    report(shard, "asleep")
    clock.pass_()
    gateway_reports(clock, qwen=(0, 1, 0))
    got = clock.pass_()

    # then: woken in the same pass, in place: the same shard, told to run
    assert got.woken == 1 and got.placed == 0
    [r] = replicas(model)
    assert (r.state, r.reason) == (ReplicaState.STARTING, "waking: 1 request(s) waiting")
    assert [(s.shard_id, s.state) for s in desired_set("gpu-01").shards] == [(shard.pk, "running")]

    # when: it answers again, 3 s later
    clock.now += timedelta(seconds=3)
    report(shard, "ready")
    clock.pass_()
    [r] = replicas(model)
    assert r.state == ReplicaState.READY
    assert Event.objects.filter(kind=EventKind.SLEEP, reason__endswith="awake in 3.0 s").exists()


def test_four_models_take_turns_on_one_gpu_the_least_recently_used_sleeping():
    one_h100()
    names = ["a", "b", "c", "d"]
    clock = Clock()
    models = {}
    for n in names:
        models[n] = sleepy(n)
        # each new one finds the GPU held, puts the one awake to sleep, and is placed
        # once that one's node says it sleeps
        for _ in range(3):
            clock.pass_()
            for m in models.values():
                asleep(m)
                make_ready(m)
    awake = [n for n in names if replicas(models[n])[0].state == ReplicaState.READY]
    assert awake == ["d"]
    assert [replicas(models[n])[0].state for n in "abc"] == ["asleep"] * 3
    assert "made way for d (priority 0)" in replicas(models["c"])[0].reason

    # when: requests wait for a, while c was used more recently than b
    gateway_reports(clock, a=(0, 1, 0), b=(0, 0, 900), c=(0, 0, 300), d=(0, 0, 10))
    clock.pass_()

    # then: d, the one awake, makes way; a waits for it, and wakes once it sleeps
    [ra] = replicas(models["a"])
    assert (ra.state, ra.reason) == (ReplicaState.ASLEEP, "asleep: waking once d sleeps")
    [rd] = replicas(models["d"])
    assert rd.state == ReplicaState.ASLEEP and rd.reason == "asleep: made way for a (priority 0)"
    # never more awake than the GPU holds: a is still told to sleep
    assert sorted(desired_set("gpu-01").shards, key=lambda s: s.model)[0].state == "asleep"
    asleep(models["d"])
    clock.pass_()
    [ra] = replicas(models["a"])
    assert ra.state == ReplicaState.STARTING and ra.reason.startswith("waking")
    awake_shards = [s for s in desired_set("gpu-01").shards if s.state == "running"]
    assert [s.model for s in awake_shards] == ["a"]


def test_a_higher_priority_replica_never_sleeps_for_a_lower_one():
    one_h100()
    low = sleepy("low", prio=10)
    clock = Clock()
    clock.pass_()
    make_ready(low)
    clock.pass_()
    high = sleepy("high", prio=50)
    clock.pass_()
    asleep(low)
    clock.pass_()
    make_ready(high)
    clock.pass_()
    assert replicas(low)[0].state == ReplicaState.ASLEEP
    assert replicas(high)[0].state == ReplicaState.READY

    # when: requests wait for low, the one asleep
    gateway_reports(clock, low=(0, 4, 0), high=(0, 0, 500))
    clock.pass_()

    # then: high stays awake, and low says why it cannot wake
    assert replicas(high)[0].state == ReplicaState.READY
    [r] = replicas(low)
    assert r.state == ReplicaState.ASLEEP
    assert r.reason == "asleep: cannot wake: gpu-01: GPU 0 has 28.6 GB free, needs 50.0"
    assert [s.state for s in desired_set("gpu-01").shards if s.model == "high"] == ["running"]


def test_a_model_that_does_not_sleep_is_never_put_to_sleep():
    one_h100()
    always = add_model("always", engine="vllm", gpus_per_node=1, tp=1, gpu_memory_gb=50)
    clock = Clock()
    clock.pass_()
    make_ready(always)
    clock.pass_()
    other = sleepy("other", prio=0)
    clock.pass_()
    clock.pass_()

    assert replicas(always)[0].state == ReplicaState.READY
    [r] = replicas(other)
    assert r.state == ReplicaState.PENDING and "GPU" in r.reason


def test_an_asleep_replica_whose_engine_died_is_replaced():
    one_h100()
    model = sleepy("qwen")
    clock = fallen_asleep(model)
    [shard] = shards_of(model, desired_state="asleep")
    clock.pass_()

    # when: its engine dies while asleep
    report(shard, "failed", error="exited with code -9", exit_code=-9)
    clock.pass_()
    clock.now += timedelta(seconds=11)
    clock.pass_()

    # then: a new replica is placed in its stead
    live = [r for r in replicas(model) if r.state != ReplicaState.STOPPED]
    assert len(live) == 1
    new = running(model)
    assert len(new) == 1 and new[0].pk != shard.pk


def test_sleeping_replicas_hold_host_memory_and_placement_says_so():
    # a node of 64 GB whose sleeping replica keeps its 50 GB of weights in memory
    one_h100(memory_gb=64)
    model = sleepy("qwen")
    profile = model.active_profile
    profile.estimate = {
        "key": estimate_key(profile),
        "total_bytes": 58 * 10**9,
        "weights_bytes": 50 * 10**9,
        "kv_bytes": 8 * 10**9,
    }
    profile.save()
    fallen_asleep(model)

    cpu = add_model("cpu-model", engine="llamacpp", gpus_per_node=0, min_memory_gb=16)
    verdicts, _ = explain(build(), request_for(cpu, cpu.active_profile))

    assert [v.text for v in verdicts] == [
        "gpu-01: 50 of 64 GB host memory held by sleeping replicas, needs 16"
    ]


def test_asleep_for_stop_after_asleep_s_scales_the_model_to_zero():
    one_h100()
    model = sleepy("qwen", min_replicas=0, max_replicas=1, after=60, stop_after_asleep_s=600)
    Model.objects.filter(pk=model.pk).update(desired_replicas=1)
    clock = fallen_asleep(model)
    clock.now += timedelta(seconds=480)
    gateway_reports(clock, qwen=(0, 0, 600))
    clock.pass_()
    assert replicas(model)[0].state == ReplicaState.ASLEEP

    clock.now += timedelta(seconds=61)
    gateway_reports(clock, qwen=(0, 0, 661))
    clock.pass_()

    model.refresh_from_db()
    assert model.desired_replicas == 0
    event = Event.objects.filter(kind=EventKind.AUTOSCALE).latest("created_at")
    assert event.reason == "asleep for 601 s (stop after 600 s asleep)"
    assert [s.state for s in desired_set("gpu-01").shards] == ["stopped"]


def test_a_wake_that_would_take_its_team_past_its_quota_waits_and_says_why():
    # given: team research may hold 60 GB of GPU memory; its model "qwen" (50 GB) is
    # asleep, and its other model "chat" (50 GB) was placed awake meanwhile
    add_node("gpu-01", gpus=[{**g, "uuid": f"GPU-gpu-01-{g['index']}"} for g in H100_GPUS[:2]])
    research = Team.objects.create(
        name="research", group=Group.objects.create(name="research"), max_gpu_memory_gb=60
    )
    qwen = sleepy("qwen")
    Model.objects.filter(pk=qwen.pk).update(team=research)
    clock = fallen_asleep(qwen)
    chat = sleepy("chat", after=3600)
    Model.objects.filter(pk=chat.pk).update(team=research)
    clock.pass_()
    make_ready(chat)
    clock.pass_()
    assert replicas(chat)[0].state == ReplicaState.READY

    # when: requests wait for qwen
    gateway_reports(clock, qwen=(0, 2, 0), chat=(0, 0, 10))
    clock.pass_()

    # then: it stays asleep, saying which quota, and nothing is put to sleep for a wake
    # that could not happen
    [r] = replicas(qwen)
    assert r.state == ReplicaState.ASLEEP
    assert r.reason == (
        "asleep: cannot wake: team research: 50 of 60 GB of GPU memory in use, needs 50 more"
    )
    assert replicas(chat)[0].state == ReplicaState.READY


def test_another_teams_replica_never_sleeps_to_wake_one_of_equal_priority():
    one_h100()
    research = Team.objects.create(name="research", group=Group.objects.create(name="research"))
    ours = sleepy("ours")
    clock = fallen_asleep(ours)  # ours placed first, then asleep
    theirs = sleepy("theirs")  # research's, placed awake in the room ours gave back
    Model.objects.filter(pk=theirs.pk).update(team=research)
    for _ in range(3):
        clock.pass_()
        make_ready(theirs)
    assert replicas(theirs)[0].state == ReplicaState.READY

    # when: requests wait for ours, a model of the fleet's
    gateway_reports(clock, ours=(0, 1, 0), theirs=(0, 0, 900))
    clock.pass_()

    # then: research's replica stays awake; ours cannot wake and says why
    assert replicas(theirs)[0].state == ReplicaState.READY
    [r] = replicas(ours)
    assert r.state == ReplicaState.ASLEEP and r.reason.startswith("asleep: cannot wake: gpu-01")
