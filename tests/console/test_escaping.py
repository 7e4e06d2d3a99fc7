"""Strings from agents are shown as text on every console page, never run as markup."""

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet.models import Event, EventKind, LocalWeights, Shard
from tests.factories import H100_GPUS, add_model, add_node, add_replica, operator, report_load

pytestmark = pytest.mark.django_db

EVIL = "<script>alert(1)</script>"


@pytest.fixture
def evil_node():
    """A node registered by an agent that put markup into every string it could."""
    add_node(
        "gpu-01",
        as_reported=True,
        hostname=f"host{EVIL}",
        labels={"zone": EVIL, f"k{EVIL}"[:63]: "v"},
        agent_version="0.1<marquee>",
        engine_versions={"llamacpp": EVIL},
        gpus=[{**g, "name": f"H100 {EVIL}"} for g in H100_GPUS[:2]],
        storage=[{"path": f"/data/{EVIL}", "free_bytes": 1, "total_bytes": 2}],
        provision=[{"engine": "vllm", "version": EVIL, "state": "failed", "detail": EVIL}],
        weights=[
            {"path": f"/models/{EVIL}", "size_bytes": 2, "source": f"https://m.example/{EVIL}"}
        ],
    )
    model = add_model("qwen")
    replica = add_replica(model, model.active_profile, ["gpu-01"])
    Shard.objects.filter(replica=replica).update(error=f"exit 1: {EVIL}")
    replica.reason = f"no node fits: gpu-01: GPU {EVIL}"
    replica.state = "pending"
    replica.save()
    report_load("gpu-01")
    LocalWeights.objects.filter(node_id="gpu-01").update(kept_reason=f"kept: {EVIL}")
    Event.objects.create(
        created_at=timezone.now(),
        kind=EventKind.AUTOSCALE,
        model=model,
        model_name=model.name,
        direction="up",
        from_replicas=0,
        to_replicas=1,
        reason=f"waiting {EVIL}",
    )
    return model


def test_every_page_renders_agent_strings_as_text(client, evil_node):
    client.force_login(operator())
    pages = [
        reverse("console:cluster"),
        reverse("console:cluster-fragment"),
        reverse("console:node", args=["gpu-01"]),
        reverse("console:node-fragment", args=["gpu-01"]),
        reverse("console:node-charts", args=["gpu-01"]),
        reverse("console:node-action", args=["gpu-01", "cordon"]),
        reverse("console:model", args=[evil_node.pk]),
        reverse("console:model-fragment", args=[evil_node.pk]),
    ]
    for url in pages:
        html = client.get(url).content.decode()
        assert "<script>alert" not in html, url
        assert "<marquee>" not in html, url
    node = client.get(pages[2]).content.decode()
    for shown in ("host&lt;script&gt;", "H100 &lt;script&gt;", "/data/&lt;script&gt;"):
        assert shown in node
    assert "exit 1: &lt;script&gt;alert(1)&lt;/script&gt;" in node
    assert 'data-path="/models/&lt;script&gt;alert(1)&lt;/script&gt;"' in node
    assert "https://m.example/&lt;script&gt;" in node and "kept: kept: &lt;script&gt;" in node
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get(pages[0]).content.decode()
    model = client.get(pages[6]).content.decode()
    assert "GPU &lt;script&gt;" in model
    assert "waiting &lt;script&gt;alert(1)&lt;/script&gt;" in model
