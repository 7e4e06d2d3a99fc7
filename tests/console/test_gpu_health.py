"""GPU health and a node's notice in the console (docs/operations.md, "GPU faults and
notices"): counts by health and the brake on the cluster page; each GPU's health, reason
and XIDs, the notice and the node's own events on its page; clearing a fault there, with
a reason, for those allowed only."""

import re

import pytest
from auditlog.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from fleet.models import GPU, Event, FleetStatus, Node
from fleet.services import gpu_health
from tests.factories import (
    add_node,
    grant,
    operator,
    report_gpu_events,
    staff_user,
)

pytestmark = pytest.mark.django_db

CLUSTER = reverse("console:cluster")
XID_79 = "XID 79: GPU has fallen off the bus"


def node_url(name="node", node_id="gpu-01", *args):
    return reverse(f"console:{name}", args=[node_id, *args])


def clear_url(index=3, node_id="gpu-01"):
    return reverse("console:gpu-clear", args=[node_id, index])


def gpu_row(html: str, index: int) -> str:
    m = re.search(rf'<tr class="gpu-row[^"]*" data-gpu-index="{index}">(.*?)</tr>', html, re.S)
    assert m, f"no row for GPU {index}"
    return m.group(1)


@pytest.fixture
def sick():
    """gpu-01: GPU 3 fell off the bus, GPU 4 had a contained ECC error (94: degraded) and
    GPU 5 two application faults (13: watched). gpu-02 lost a GPU too, its own events."""
    add_node("gpu-01")
    add_node("gpu-02")
    report_gpu_events("gpu-01", (3, "xid", 79), (4, "xid", 94), (5, "xid", 13), (5, "xid", 13))
    report_gpu_events("gpu-02", (0, "xid", 48))


def test_the_cluster_page_counts_gpus_by_health_and_marks_the_sick_ones(client, sick):
    client.force_login(operator())

    html = client.get(CLUSTER).content.decode()

    counts = dict(re.findall(r'data-health="(\w+)">\w+ <b>(\d+)</b>', html))
    assert counts == {"healthy": "13", "degraded": "1", "failed": "2"}
    assert 'data-total="gpus-problems">3<' in html, "a fault keeps a GPU from placements"
    row = re.search(r'data-node-id="gpu-01">(.*?)</tr>', html, re.S).group(1)
    bar = re.search(r'<span class="bar gpu [^"]*" data-gpu-index="3"[^>]*>', row).group(0)
    assert "health-failed" in bar and f"failed: {XID_79}" in bar


def test_the_brake_is_a_banner_on_the_cluster_page_and_every_admin_page(client, sick):
    brake = "2 of 16 GPUs failed; at most 1 are drained in 600 s (LLMGW_GPU_FAILURE_BRAKE 0.05)"
    FleetStatus.objects.create(pk=1, last_pass_at=timezone.now(), gpu_brake=brake)
    client.force_login(operator())

    cluster = client.get(CLUSTER).content.decode()
    fragment = client.get(reverse("console:cluster-fragment")).content.decode()
    admin = client.get(reverse("admin:fleet_gpu_changelist")).content.decode()

    for page in (cluster, fragment, admin):
        assert f"GPU brake on: {brake}" in page
    assert cluster.count("GPU brake on") == 1  # in the refreshed body only

    FleetStatus.objects.filter(pk=1).update(gpu_brake="")
    assert "GPU brake" not in client.get(CLUSTER).content.decode()


def test_the_node_page_shows_each_gpus_health_reason_and_xids(client, sick):
    client.force_login(operator())

    for html in (
        client.get(node_url()).content.decode(),
        client.get(node_url("node-fragment")).content.decode(),
    ):
        failed, degraded, watched = gpu_row(html, 3), gpu_row(html, 4), gpu_row(html, 5)
        assert "<b>failed</b>" in failed and XID_79 in failed
        assert 'class="gpu-xids">79×1<' in failed
        assert "<b>degraded</b>" in degraded and "XID 94: Contained ECC error" in degraded
        assert "<b>healthy</b>" in watched and 'class="gpu-xids">13×2<' in watched
        assert 'class="gpu-xids">-<' in gpu_row(html, 0)


def test_the_node_page_lists_its_own_gpu_and_notice_events(client, sick):
    gpu_health.give_notice(Node.objects.get(pk="gpu-01"), 90, "aws", "spot instance reclaim")
    client.force_login(operator())

    html = client.get(node_url()).content.decode()

    events = html[html.index('id="node-events"') :]
    assert "GPU gpu-01/gpu3: healthy → failed (XID 79" in events
    assert "node gpu-01 goes away in 90 s (aws: spot instance reclaim" in events
    assert 'class="event-kind">notice<' in events
    assert "gpu-02/gpu0" not in events, "another node's events are its own page's"


def test_the_node_page_shows_its_notice_while_it_has_one(client):
    add_node("gpu-01")
    client.force_login(operator())
    assert 'id="node-notice"' not in client.get(node_url()).content.decode()

    gpu_health.give_notice(Node.objects.get(pk="gpu-01"), 120, "gcp", "<maintenance>")
    html = client.get(node_url()).content.decode()
    cluster = client.get(CLUSTER).content.decode()

    notice = re.search(r'<dd id="node-notice"[^>]*>(.*?)</dd>', html, re.S).group(1)
    deadline = Node.objects.get(pk="gpu-01").notice_deadline
    assert timezone.localtime(deadline).strftime("%Y-%m-%d %H:%M:%S") in notice
    assert 'class="notice-source">gcp<' in notice
    assert 'class="notice-reason">&lt;maintenance&gt;<' in notice, "escaped"
    assert 'class="node-notice"' in cluster and "goes away in 1" in cluster


# ---- clearing a fault from the node page ------------------------------------------------


def test_an_operator_clears_a_fault_after_a_confirmation_that_asks_why(client, sick):
    client.force_login(operator())

    # the button, on the failed GPU only
    html = client.get(node_url()).content.decode()
    assert f'href="{clear_url(3)}"' in gpu_row(html, 3)
    assert f'href="{clear_url(4)}"' in gpu_row(html, 4), "a degraded fault too"
    assert "gpu-clear" not in gpu_row(html, 5) + gpu_row(html, 0)

    confirm = client.get(clear_url(3)).content.decode()
    assert "GPU gpu-01/gpu3 is failed (XID 79: GPU has fallen off the bus)" in confirm
    assert 'name="reason"' in confirm and 'id="confirm-clear"' in confirm

    # no reason: asked again, nothing changed
    refused = client.post(clear_url(3), {"reason": "  "})
    assert refused.status_code == 400
    assert "say why the GPU is fine again" in refused.content.decode()
    assert GPU.objects.get(node_id="gpu-01", index=3).fault == "failed"

    done = client.post(clear_url(3), {"reason": "reseated the board"}, follow=True)

    assert done.redirect_chain[-1][0] == node_url()
    page = done.content.decode()
    assert "GPU gpu-01/gpu3 cleared by user &#x27;ops&#x27;: reseated the board" in page
    assert "<b>healthy</b>" in gpu_row(page, 3)
    g = GPU.objects.get(node_id="gpu-01", index=3)
    entry = LogEntry.objects.get_for_object(g).get()
    assert entry.additional_data["door"] == "console"
    assert entry.changes_dict["reason"] == ["", "reseated the board"]
    assert Event.objects.filter(node_id="gpu-01", reason__contains="cleared by").exists()


def test_no_button_and_no_clear_without_the_permission(client, sick):
    viewer = grant(staff_user("viewer"), "fleet.view_node")
    client.force_login(viewer)

    html = client.get(node_url()).content.decode()
    assert "gpu-clear" not in html
    assert XID_79 in html, "the health is shown to whoever sees the node"
    assert client.get(clear_url(3)).status_code == 403
    assert client.post(clear_url(3), {"reason": "reset"}).status_code == 403
    assert GPU.objects.get(node_id="gpu-01", index=3).fault == "failed"

    client.force_login(grant(viewer, "fleet.drain_node"))
    assert "gpu-clear" in client.get(node_url()).content.decode()


def test_an_unknown_gpu_is_404(client, sick):
    client.force_login(operator())
    assert client.get(clear_url(9)).status_code == 404
    assert client.post(clear_url(0, node_id="nope"), {"reason": "x"}).status_code == 404
