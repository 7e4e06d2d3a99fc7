"""GPU faults and a node's notice in the admin (docs/operations.md, "GPU faults and
notices"): each GPU's health on its node's page and the GPUs list, clearing a fault with
the reason beside the action, and notice given through an intermediate page. Both go
through fleet.services.gpu_health and its permission; bad input changes nothing."""

import pytest
from auditlog.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from fleet.models import GPU, Event, EventKind, Node
from tests.factories import add_node, grant, operator, report_gpu_events, staff_user

pytestmark = pytest.mark.django_db

GPUS = reverse("admin:fleet_gpu_changelist")
NODES = reverse("admin:fleet_node_changelist")
XID_79 = "XID 79: GPU has fallen off the bus"


@pytest.fixture
def failed() -> GPU:
    add_node("gpu-01")
    report_gpu_events("gpu-01", (3, "xid", 79), (3, "xid", 13))
    return GPU.objects.get(node_id="gpu-01", index=3)


def said(resp) -> list[str]:
    return [str(m) for m in get_messages(resp.wsgi_request)]


def test_the_nodes_page_and_the_gpus_list_show_health_reason_and_xids(client, failed):
    client.force_login(operator())

    node_page = client.get(reverse("admin:fleet_node_change", args=["gpu-01"])).content.decode()
    listing = client.get(GPUS + "?health__exact=failed").content.decode()

    for html in (node_page, listing):
        assert XID_79 in html
        assert "13×1, 79×1" in html, "the XIDs, by number"
    assert f'href="{GPUS}?node__id__exact=gpu-01"' in node_page, "where to clear it"
    assert "Notice of going away" in node_page
    assert listing.count('class="action-select"') == 1, "filtered to the failed GPU"
    assert 'name="reason"' in listing, "the reason beside the action"


def test_clearing_from_the_gpus_list_needs_a_reason_and_is_audited(client, failed):
    client.force_login(operator())
    post = {"action": "clear_faults", "_selected_action": [failed.pk], "index": "0"}

    refused = client.post(GPUS, {**post, "reason": ""}, follow=True)

    assert said(refused) == ["say why the GPU is fine again: the audit trail keeps it"]
    assert GPU.objects.get(pk=failed.pk).fault == "failed"

    done = client.post(GPUS, {**post, "reason": "nvidia-smi -r; diag clean"}, follow=True)

    assert said(done) == [
        "GPU gpu-01/gpu3 cleared by user 'ops': nvidia-smi -r; diag clean; it is healthy now"
    ]
    g = GPU.objects.get(pk=failed.pk)
    assert (g.health, g.fault) == ("healthy", "healthy")
    entry = LogEntry.objects.get_for_object(g).get()
    assert entry.additional_data["door"] == "admin"
    assert entry.changes_dict["reason"] == ["", "nvidia-smi -r; diag clean"]


def test_the_clear_action_is_offered_only_with_the_permission(client, failed):
    viewer = grant(staff_user("viewer"), "fleet.view_gpu", "fleet.view_node")
    client.force_login(viewer)

    assert "clear_faults" not in client.get(GPUS).content.decode()
    client.post(
        GPUS,
        {"action": "clear_faults", "_selected_action": [failed.pk], "index": "0", "reason": "x"},
    )
    assert GPU.objects.get(pk=failed.pk).fault == "failed"

    client.force_login(grant(viewer, "fleet.drain_node"))
    assert "clear_faults" in client.get(GPUS).content.decode()


def test_notice_asks_when_and_why_then_drains_the_node(client):
    add_node("gpu-01")
    client.force_login(operator())
    pick = {"action": "give_notice", "_selected_action": ["gpu-01"], "index": "0"}

    # the intermediate page: nothing changes yet
    ask = client.post(NODES, pick)
    assert ask.status_code == 200
    page = ask.content.decode()
    assert 'id="notice-form"' in page and 'name="notice_in"' in page and "gpu-01" in page
    assert Node.objects.get(pk="gpu-01").notice_deadline is None

    # a time that is not one: asked again, naming it
    bad = client.post(NODES, {**pick, "apply": "yes", "notice_in": "soon"}).content.decode()
    assert "&#x27;soon&#x27; is not a time ahead" in bad
    assert Node.objects.get(pk="gpu-01").notice_deadline is None

    done = client.post(
        NODES, {**pick, "apply": "yes", "notice_in": "2m", "reason": "rack power work"}, follow=True
    )

    [message] = said(done)
    assert message.startswith("node gpu-01 goes away in 120 s (operator: rack power work")
    node = Node.objects.get(pk="gpu-01")
    assert node.notice_deadline and node.draining and node.notice_reason == "rack power work"
    assert Event.objects.filter(kind=EventKind.NOTICE, node_id="gpu-01").count() == 1


def test_notice_is_offered_only_with_the_permission(client):
    add_node("gpu-01")
    client.force_login(grant(staff_user("viewer"), "fleet.view_node"))

    assert "give_notice" not in client.get(NODES).content.decode()
    client.post(
        NODES,
        {"action": "give_notice", "_selected_action": ["gpu-01"], "apply": "yes",
         "notice_in": "60"},
    )  # fmt: skip
    assert Node.objects.get(pk="gpu-01").notice_deadline is None
