"""Teams' quotas in placement: a replica that would take its team past a quota waits,
pending, with the reason; other teams and the fleet's own models are placed as before."""

import pytest
from django.contrib.auth.models import Group

from fleet.models import Model, ReplicaState, Team
from fleet.services import snapshot
from tests.factories import add_model, add_node
from tests.reconciler.helpers import Clock, replicas

pytestmark = pytest.mark.django_db


def team(name="research", **quotas) -> Team:
    return Team.objects.create(name=name, group=Group.objects.create(name=name), **quotas)


def owned(model, t) -> Model:
    Model.objects.filter(pk=model.pk).update(team=t)
    model.refresh_from_db()
    return model


def states(model) -> dict[str, int]:
    found: dict[str, int] = {}
    for r in replicas(model):
        found[r.state] = found.get(r.state, 0) + 1
    return found


def test_a_team_over_its_gpu_quota_is_refused_with_the_reason():
    add_node("gpu-01")  # eight H100s each
    add_node("gpu-02")
    research = team(max_gpus=8)
    llama = owned(add_model("llama", replicas=10, engine="vllm"), research)
    fleet = add_model("fleet-chat", replicas=4, engine="vllm")  # the fleet's: no team

    Clock().pass_()

    assert states(llama) == {ReplicaState.STARTING: 8, ReplicaState.PENDING: 2}
    waiting = [r for r in replicas(llama) if r.state == ReplicaState.PENDING]
    assert {r.reason for r in waiting} == {"team research: 8 of 8 GPUs in use"}
    # The team's quota bounds the team alone: the GPUs it could not take are others'.
    assert states(fleet) == {ReplicaState.STARTING: 4}
    # And `llmgw explain` says the same before anything else.
    choice = snapshot.explain_model("llama").choice
    assert choice == "cannot be placed: team research: 8 of 8 GPUs in use"


def test_raising_the_quota_places_the_waiting_replicas_on_the_next_pass():
    add_node("gpu-01")
    research = team(max_gpus=2)
    llama = owned(add_model("llama", replicas=3, engine="vllm", gpus_per_node=2), research)
    clock = Clock()
    clock.pass_()
    assert states(llama) == {ReplicaState.STARTING: 1, ReplicaState.PENDING: 2}
    pending = next(r for r in replicas(llama) if r.state == ReplicaState.PENDING)
    assert pending.reason == "team research: 2 of 2 GPUs in use, needs 2 more"

    research.max_gpus = 6
    research.save()
    clock.pass_()
    assert states(llama) == {ReplicaState.STARTING: 3}


def test_a_replica_quota_counts_every_model_of_the_team():
    add_node("gpu-01")
    research = team(max_replicas=3)
    a = owned(add_model("a", replicas=2, engine="vllm"), research)
    b = owned(add_model("b", replicas=2, engine="vllm"), research)

    Clock().pass_()

    placed = [r for r in replicas(a) + replicas(b) if r.state == ReplicaState.STARTING]
    waiting = [r for r in replicas(a) + replicas(b) if r.state == ReplicaState.PENDING]
    assert len(placed) == 3
    assert [r.reason for r in waiting] == ["team research: 3 of 3 replicas in use"]


def test_a_gpu_memory_quota_counts_shares_and_whole_gpus():
    add_node("gpu-01")  # H100s of 80 GB (81,559 MiB as NVML counts them)
    research = team(max_gpu_memory_gb=100)
    shared = owned(add_model("small", replicas=3, engine="vllm", gpu_memory_gb=40), research)
    Clock().pass_()
    # 40 + 40 GB of GPU memory held; a third share would make 120 of 100.
    assert states(shared) == {ReplicaState.STARTING: 2, ReplicaState.PENDING: 1}
    pending = next(r for r in replicas(shared) if r.state == ReplicaState.PENDING)
    assert pending.reason == "team research: 80 of 100 GB of GPU memory in use, needs 40 more"

    whole = owned(add_model("big", replicas=1, engine="vllm"), team("vision", max_gpu_memory_gb=70))
    Clock().pass_()
    # A whole GPU counts all of its memory: 79.6 GB is past a quota of 70.
    (r,) = replicas(whole)
    assert r.state == ReplicaState.PENDING
    assert r.reason == "team vision: 0 of 70 GB of GPU memory in use, needs 79.6 more"


def test_quotas_left_empty_bound_nothing():
    add_node("gpu-01")
    research = team()  # no quotas
    llama = owned(add_model("llama", replicas=8, engine="vllm"), research)
    Clock().pass_()
    assert states(llama) == {ReplicaState.STARTING: 8}
