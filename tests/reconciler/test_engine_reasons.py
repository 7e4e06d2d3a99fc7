"""Placement goes only where the engine is installed, and otherwise says why (docs/engines.md)."""

from io import StringIO

import pytest
from django.core.management import call_command

from fleet.models import Node
from fleet.services import engines
from tests.factories import add_model, add_node

pytestmark = pytest.mark.django_db


def explain(*args):
    out = StringIO()
    call_command("explain", *args, stdout=out)
    return out.getvalue().splitlines()


def install(engine, state, version="0.11.2", detail="", progress=None):
    return {"engine": engine, "version": version, "variant": "cu129", "state": state,
            "detail": detail, "progress_percent": progress}  # fmt: skip


def test_a_replica_goes_where_its_engine_is_installed_and_the_rest_say_why():
    others = {"llamacpp": "0.3.36"}
    add_node(
        "gpu-06", engines={**others, "vllm": "0.11.2"}, provision=[install("vllm", "installed")]
    )
    downloading = install("vllm", "installing", detail="downloading", progress=42)
    add_node("gpu-07", engines=others, provision=[downloading])
    add_node(
        "gpu-08",
        engines=others,
        provision=[
            install("vllm", "failed", detail="pip install exited with 1\nERROR: No matching dist")
        ],
    )
    add_node("cpu-03", engines=others, gpus=[])
    engines.set_vllm_build(Node.objects.filter(pk="cpu-03"), "none")
    add_node("gpu-09", engines=others)  # an agent that says nothing of vLLM
    add_model("qwen", engine="vllm", gpus_per_node=1)

    lines = explain("qwen")

    assert lines[1].startswith("a new replica: would go to gpu-06")
    assert "gpu-07: vllm 0.11.2 is installing (downloading, 42 %)" in lines
    assert "gpu-08: vllm 0.11.2 failed to install: pip install exited with 1" in lines
    assert "cpu-03: vllm build is none" in lines
    assert "gpu-09: engine 'vllm' is not installed" in lines
