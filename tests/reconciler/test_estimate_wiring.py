"""The estimate before placement: made for new and changed profiles, shown by explain, the
admin and the API, and standing in for the memory an operator left blank."""

import pytest
from django.urls import reverse

from agentd import tinygguf
from fleet.models import EngineProfile
from fleet.services import estimate, snapshot
from tests.factories import H100_GPUS, LLAMACPP_CPU, add_model, add_node, grant, staff_user
from tests.reconciler.helpers import Clock, replicas, running

pytestmark = pytest.mark.django_db

# A tinygguf llama whose KV cache at 131,072 tokens x 512 sequences is what counts:
# 2 (K, V) x 3 layers x 4 heads x 32 x 2 bytes = 1,536 bytes a token: 103 GB.
KV_BYTES = 1536 * 131072 * 512


@pytest.fixture(autouse=True)
def _estimate_dirs(settings, tmp_path):
    """The control plane reads local weights under the test's tmp dir only."""
    settings.LLMGW = {**settings.LLMGW, "ESTIMATE_DIRS": str(tmp_path)}


@pytest.fixture
def gguf(tmp_path):
    return str(tinygguf.write(tmp_path / "tiny.gguf", layers=3, embd=128, ff=96, ctx=4096))


def estimated(model_name):
    estimate.refresh_profiles()
    return EngineProfile.objects.get(model__name=model_name)


def test_a_new_profile_is_estimated_once_and_again_when_its_inputs_change(gguf):
    add_model("tiny", **{**LLAMACPP_CPU, "model_path": gguf})

    profile = estimated("tiny")
    first = profile.estimate
    assert first["kv_bytes"] == 1536 * 4096  # the model's own context, one sequence
    assert first["text"].startswith("needs ") and "4,096 tokens × 1 sequence" in first["text"]
    assert estimate.refresh_profiles() == 0  # nothing changed: nothing read again

    EngineProfile.objects.filter(pk=profile.pk).update(context_tokens=8192, sequences=4)
    assert estimated("tiny").estimate["kv_bytes"] == 1536 * 8192 * 4


def test_explain_the_admin_and_the_api_show_the_estimate_before_placement(gguf, client):
    add_model("tiny", **{**LLAMACPP_CPU, "model_path": gguf})
    assert "memory not estimated yet" in snapshot.explain_model("tiny").summary
    text = estimated("tiny").estimate["text"]

    summary = snapshot.explain_model("tiny").summary
    client.force_login(grant(staff_user(), "fleet.view_engineprofile"))
    admin = client.get(reverse("admin:fleet_engineprofile_changelist")).content.decode()

    assert summary.endswith(f"; {text}")
    assert text in admin


def test_weights_that_cannot_be_read_say_why_where_the_estimate_would_be(tmp_path):
    add_model("gone", **{**LLAMACPP_CPU, "model_path": str(tmp_path / "nope.gguf")})

    profile = estimated("gone")

    assert "nope.gguf" in profile.estimate["error"]
    assert snapshot.explain_model("gone").summary.split("; ")[-1].startswith("no estimate: ")


def test_a_cpu_profile_without_min_memory_needs_its_estimate_in_node_memory(gguf):
    # given a 64 GB node and a model needing ~103 GB of KV cache at 131,072 x 512
    add_node("cpu-01", gpus=[], memory_gb=64)
    model = add_model(
        "tiny", **{**LLAMACPP_CPU, "model_path": gguf, "context_tokens": 131072, "sequences": 512}
    )
    need = estimated("tiny").estimate["total_bytes"]
    assert need > KV_BYTES

    Clock().pass_()

    assert running(model) == []
    reason = replicas(model)[0].reason
    assert f"needs {-(-need // 10**9)}" in reason and "cpu-01: has 64 GB of memory" in reason


def test_a_whole_gpu_profile_goes_only_where_each_gpu_holds_its_share_of_the_estimate(gguf):
    # given a node of 8 H100s (79.6 GB each) and one of 16 GB cards
    add_node("gpu-01")
    small = [
        {**g, "uuid": f"GPU-small-{g['index']}", "name": "Tesla T4", "memory_total_mb": 15360}
        for g in H100_GPUS
    ]
    add_node("t4-01", gpus=small)
    # a model needing ~103 GB on 2 whole GPUs: ~52 each, more than a T4 holds
    model = add_model(
        "tiny",
        engine="vllm",
        gpus_per_node=2,
        tp=2,
        model_path=gguf,
        context_tokens=131072,
        sequences=512,
    )
    per_gpu = estimated("tiny").estimate["total_bytes"] / 2 / 2**30

    verdicts = {v.node_id: v for v in snapshot.explain_model("tiny").verdicts}
    Clock().pass_()

    assert [s.node_id for s in running(model)] == ["gpu-01"]
    assert f"t4-01: its GPUs have at most 15.0 GB, needs {per_gpu:.1f} on each of 2" in (
        verdicts["t4-01"].text
    )
    assert verdicts["gpu-01"].fits


def test_llama_cpp_sharing_a_gpu_is_told_as_many_layers_as_its_budget_holds(gguf):
    from fleet.services.desired import desired_set

    # given the tiny llama at 131,072 tokens x 512: each of its 3 layers ~34 GB of KV cache
    add_node("gpu-01")
    for name, budget in (("one-layer", 40), ("no-layer", 20)):
        add_model(
            name,
            engine="llamacpp",
            gpu_memory_gb=budget,
            model_path=gguf,
            context_tokens=131072,
            sequences=512,
        )
    estimate.refresh_profiles()
    per_layer = EngineProfile.objects.get(model__name="one-layer").estimate["kv_bytes"] / 3

    Clock().pass_()

    told = {s.model: s.gpu_layers for s in desired_set("gpu-01").shards}
    # 36 of 40 GB (a tenth for compute buffers) hold one layer; 18 of 20 hold none
    assert int(40 * 2**30 * 0.9 // per_layer) == 1
    assert told == {"one-layer": 1, "no-layer": 0}


def test_the_control_plane_reads_no_file_outside_its_estimate_dirs(tmp_path_factory, settings):
    # given: a real GGUF outside LLMGW_ESTIMATE_DIRS, and a link to it from inside
    outside = tmp_path_factory.mktemp("elsewhere")
    real = tinygguf.write(outside / "tiny.gguf", layers=3, embd=128, ff=96, ctx=4096)
    inside = tmp_path_factory.getbasetemp() / "inside"
    inside.mkdir()
    (inside / "link.gguf").symlink_to(real)
    settings.LLMGW = {**settings.LLMGW, "ESTIMATE_DIRS": str(inside)}
    add_model("direct", **{**LLAMACPP_CPU, "model_path": str(real)})
    add_model("linked", **{**LLAMACPP_CPU, "model_path": str(inside / "link.gguf")})

    # then: neither is read, and each says where the control plane reads
    for name in ("direct", "linked"):
        found = estimated(name).estimate
        assert "total_bytes" not in found, found
        assert "reads local weights only under LLMGW_ESTIMATE_DIRS" in found["error"]

    # and inside them it is read
    settings.LLMGW = {**settings.LLMGW, "ESTIMATE_DIRS": str(outside)}
    EngineProfile.objects.update(estimate={})
    assert estimated("direct").estimate["total_bytes"] > 0


def test_the_control_plane_reads_no_url_on_an_internal_address_unless_allowed(
    tiny_server, settings
):
    # given: weights served on 127.0.0.1
    add_model("served", **{**LLAMACPP_CPU, "model_path": tiny_server.url("tiny.gguf")})

    # then: refused, naming the address, and the server was asked nothing
    found = estimated("served").estimate
    assert "127.0.0.1, a loopback address" in found["error"], found
    assert tiny_server.requests == []

    # and with its network allowed, read
    settings.LLMGW = {**settings.LLMGW, "ESTIMATE_ALLOW_NETWORKS": "127.0.0.0/8"}
    EngineProfile.objects.update(estimate={})
    assert estimated("served").estimate["total_bytes"] > 0
    assert tiny_server.requests


@pytest.fixture
def tiny_server(tmp_path):
    from tests.processes.weights_server import WeightsServer

    data = tinygguf.write(tmp_path / "tiny.gguf", layers=3, embd=128, ff=96, ctx=4096)
    with WeightsServer() as srv:
        srv.files["tiny.gguf"] = data.read_bytes()
        yield srv


def test_vllm_on_a_cpu_node_is_told_its_kv_cache_from_the_estimate_or_its_memory(tmp_path):
    from agentd import tinyhf
    from fleet.services.desired import desired_set

    # given a CPU node with vLLM, and the tiny Hugging Face model at 8,192 tokens x 64:
    # 2 (K, V) x 2 layers x 2 heads x 64 x 2 bytes = 1,024 bytes a token, 0.5 GiB
    hf = str(tinyhf.write(tmp_path / "tiny-hf"))
    add_node("cpu-01", gpus=[], memory_gb=64, engines={"vllm": "0.32.0"})
    sized = {"engine": "vllm", "gpus_per_node": 0, "model_path": hf, "sequences": 64}
    add_model("estimated", **sized, context_tokens=8192)
    # one whose operator reserved 6 GB: the KV cache gets what the weights leave of it
    add_model("reserved", **sized, context_tokens=8192, min_memory_gb=6)
    # one of 4x the tokens: 2 GiB
    add_model("longer", **sized, context_tokens=32768)
    estimate.refresh_profiles()
    assert EngineProfile.objects.get(model__name="estimated").estimate["kv_bytes"] == 2**29

    Clock().pass_()

    told = {s.model: s.kv_cache_gb for s in desired_set("cpu-01").shards}
    weights = EngineProfile.objects.get(model__name="reserved").estimate["weights_bytes"]
    assert told == {"estimated": 1, "reserved": (6 * 10**9 - weights) // 2**30, "longer": 2}
    assert told["reserved"] == 5
