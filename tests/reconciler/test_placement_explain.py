"""`manage.py explain MODEL`: every node and why it fits or not, and "what if"."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from fleet.models import EngineProfile, Model, Shard
from fleet.services import snapshot
from tests.factories import add_model, add_node

pytestmark = pytest.mark.django_db


def explain(*args):
    out = StringIO()
    call_command("explain", *args, stdout=out)
    return out.getvalue().splitlines()


def fleet():
    add_node("gpu-07", memory_gb=8, gpus=[])
    add_node("gpu-08", memory_gb=64, gpus=[])
    add_node("old-agent", memory_gb=None, gpus=[])
    add_node("coder", memory_gb=64, gpus=[], labels={"role": "coding"})


def test_explain_lists_every_node_with_its_reason():
    fleet()
    add_model("qwen", gpus_per_node=0, engine="llamacpp", min_memory_gb=24)

    lines = explain("qwen")

    assert lines[0] == (
        "model qwen, profile default: llamacpp, CPU, 24 GB of memory, policy binpack; "
        "memory not estimated yet"
    )
    assert lines[1].startswith("a new replica: would go to ")
    assert lines[2:] == [
        "coder: fits (CPU)",
        "gpu-07: has 8 GB of memory, needs 24",
        "gpu-08: fits (CPU)",
        "old-agent: fits (memory not reported)",
    ]


def test_explain_a_profile_that_is_not_active_yet():
    fleet()
    model = add_model("qwen", gpus_per_node=0, engine="llamacpp")
    EngineProfile.objects.create(
        model=model,
        name="coding",
        engine="llamacpp",
        model_path="/m",
        min_memory_gb=24,
        node_selector="role=coding",
    )

    lines = explain("qwen", "--profile", "coding")

    assert "gpu-08: labels do not match 'role=coding' of 'role=coding'" in lines
    assert "coder: fits (CPU)" in lines
    assert lines[1] == "a new replica: would go to coder (port 30000)"


def test_explain_what_a_catalog_file_would_do_without_applying_it(tmp_path):
    fleet()
    path = tmp_path / "catalog.yaml"
    path.write_text(
        "models:\n  - name: big\n    profiles:\n      - name: cpu\n        engine: llamacpp\n"
        "        model_path: /m\n        min_memory_gb: 100\n"
    )

    lines = explain("big", "-f", str(path))

    # an old agent that never said its memory is not a small machine
    assert lines[1] == "a new replica: would go to old-agent (port 30000)"
    assert lines[2:] == [
        "coder: has 64 GB of memory, needs 100",
        "gpu-07: has 8 GB of memory, needs 100",
        "gpu-08: has 64 GB of memory, needs 100",
        "old-agent: fits (memory not reported)",
    ]
    assert not Model.objects.filter(name="big").exists()


def test_explain_shows_gpus_in_use_and_nvlink():
    add_node("gpu-01")
    model = add_model("llama", engine="vllm", gpus_per_node=8, tp=8)
    from tests.reconciler.helpers import Clock

    Clock().pass_()  # the first replica takes all eight GPUs

    result = snapshot.explain_model("llama")

    assert [v.text for v in result.verdicts] == ["gpu-01: has 0 free GPUs, needs 8"]
    assert Shard.objects.filter(replica__model=model).count() == 1
    data = result.as_dict()
    assert data["placement"] == [] and data["nodes"][0]["fits"] is False


def test_explain_refuses_unknown_names():
    add_model("qwen")
    with pytest.raises(CommandError, match="no model 'nope'"):
        explain("nope")
    with pytest.raises(CommandError, match=r"model 'qwen' has no profile 'x' \(it has: default\)"):
        explain("qwen", "--profile", "x")
