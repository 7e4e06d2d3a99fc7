"""A shard's GPU memory against its budget, as its node measured it (NVML, per process):
on the node page, in the admin, the API and the metrics, and in what placement counts."""

import re

import pytest
from django.urls import reverse

from fleet.models import GPU, Shard
from fleet.services import snapshot
from tests.api.test_fleet_metrics import scrape
from tests.factories import (
    add_model,
    add_node,
    add_replica,
    grant,
    operator,
    report_load,
    staff_user,
)

pytestmark = pytest.mark.django_db

GIB_MB = 1024


@pytest.fixture
def shared_gpu():
    """gpu-01's GPU 0 shared by qwen (30 GB, holding 28) and llama (20.5 GB, holding 22);
    big holds GPU 1 whole (70 GB measured). Returns {model: shard}."""
    add_node("gpu-01", as_reported=True)
    gpu0, gpu1 = (GPU.objects.get(node_id="gpu-01", index=i).uuid for i in (0, 1))
    shards = {}
    for name, budget, uuid in (("qwen", 30, gpu0), ("llama", 20.5, gpu0), ("big", None, gpu1)):
        model = add_model(name, engine="vllm", gpu_memory_gb=budget)
        replica = add_replica(model, model.active_profile, ["gpu-01"])
        Shard.objects.filter(replica=replica).update(gpu_uuids=[uuid])
        shards[name] = replica.shards.get()
    used = {"qwen": 28 * GIB_MB, "llama": 22 * GIB_MB, "big": 70 * GIB_MB}
    report_load(
        "gpu-01",
        shards=[
            {"shard_id": s.pk, "cpu_cores": 1.0, "rss_bytes": 2**30, "gpu_memory_mb": used[n]}
            for n, s in shards.items()
        ],
    )
    return shards


def test_the_node_page_shows_each_shards_use_of_its_budget_and_flags_the_one_over(
    client, shared_gpu
):
    client.force_login(operator())

    html = client.get(reverse("console:node", args=["gpu-01"])).content.decode()

    found = re.findall(r'data-shard-id="([^"]+)".*?class="shard-gpu-memory([^"]*)">([^<]*)<', html)
    cells = {sid: (cls.strip(), text) for sid, cls, text in found}
    assert cells[shared_gpu["qwen"].pk] == ("", "28.0 of 30 GB")
    assert cells[shared_gpu["llama"].pk] == ("over-budget", "22.0 of 20.5 GB: over its budget")
    assert cells[shared_gpu["big"].pk] == ("", "70.0 GB")


def test_the_api_carries_budget_use_and_the_flag(api, shared_gpu):
    got = {s["id"]: s for s in api.get("/api/v1/shards/?node=gpu-01").json()["results"]}
    nested = api.get("/api/v1/replicas/").json()["results"]

    qwen, llama, big = (got[shared_gpu[n].pk] for n in ("qwen", "llama", "big"))
    assert (qwen["gpu_memory_budget_gb"], qwen["gpu_memory_used_mb"]) == (30.0, 28 * GIB_MB)
    assert (qwen["over_gpu_budget"], llama["over_gpu_budget"]) == (False, True)
    assert (big["gpu_memory_budget_gb"], big["over_gpu_budget"]) == (None, False)
    assert {s["id"]: s["over_gpu_budget"] for r in nested for s in r["shards"]} == {
        shard.pk: name == "llama" for name, shard in shared_gpu.items()
    }


def test_the_admin_lists_use_of_budget(client, shared_gpu):
    client.force_login(
        grant(staff_user(), "fleet.view_shardload", "fleet.view_node", "fleet.view_shard")
    )

    loads = client.get(reverse("admin:fleet_shardload_changelist")).content.decode()
    node = client.get(reverse("admin:fleet_node_change", args=["gpu-01"])).content.decode()

    for html in (loads, node):
        assert "22.0 of 20.5 GB: over its budget" in html
        assert "28.0 of 30 GB" in html


def test_the_metrics_say_use_budget_and_over(shared_gpu):
    got = scrape()

    def key(name, model):
        shard = shared_gpu[model]
        labels = {("node", "gpu-01"), ("shard", shard.pk), ("model", model)}
        return (name, frozenset(labels))

    assert got[key("llmgw_shard_gpu_memory_bytes", "llama")] == 22 * 2**30
    assert got[key("llmgw_shard_gpu_memory_budget_bytes", "llama")] == 20.5 * 2**30
    assert got[key("llmgw_shard_over_gpu_budget", "llama")] == 1
    assert got[key("llmgw_shard_over_gpu_budget", "qwen")] == 0
    assert key("llmgw_shard_over_gpu_budget", "big") not in got  # whole GPUs have no budget


def test_placement_counts_what_shards_hold_so_others_use_is_not_hidden(shared_gpu):
    # given GPU 0 with 60 GiB in use: qwen holds 28 of its 30, llama 22 (1.5 over
    # its 20.5), and so 10 GiB belong to a process llmgw did not start
    GPU.objects.filter(node_id="gpu-01", index=0).update(memory_used_mb=60 * GIB_MB)

    (node,) = snapshot.build().nodes.values()
    gpu0 = next(g for g in node.gpus if g.index == 0)

    assert gpu0.promised_mb == round(50.5 * GIB_MB)
    # 60 in use less what the shares hold of their budgets (28 + 20.5): the 1.5 over
    # llama's budget and the other process's 10 are not there to promise.
    assert gpu0.other_mb == round(11.5 * GIB_MB)
