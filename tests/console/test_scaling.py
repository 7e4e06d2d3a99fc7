"""Scaling on the console: where an autoscaled model stands, its bounds, the last decision."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet.models import Event, EventKind, Model
from tests.factories import add_model, add_node, add_replica, operator

pytestmark = pytest.mark.django_db

CLUSTER = reverse("console:cluster")


def model_url(model, name="model"):
    return reverse(f"console:{name}", args=[model.pk])


def text(html: str, element_id: str) -> str:
    """The text of the element with this id, its markup taken out."""
    m = re.search(rf'<(\w+)[^>]*\bid="{element_id}"[^>]*>(.*?)</\1>', html, re.S)
    assert m, f"no #{element_id}"
    return re.sub(r"<[^>]+>", "", m.group(2)).strip()


def decision(model, ago: timedelta, frm: int, to: int, reason: str) -> Event:
    return Event.objects.create(
        created_at=timezone.now() - ago,
        kind=EventKind.AUTOSCALE,
        model=model,
        model_name=model.name,
        direction="up" if to > frm else "down",
        from_replicas=frm,
        to_replicas=to,
        reason=reason,
    )


@pytest.fixture
def idle():
    """An autoscaled model the autoscaler took to zero after a quiet quarter of an hour."""
    model = add_model("idle", replicas=0)
    Model.objects.filter(pk=model.pk).update(
        min_replicas=0, max_replicas=4, scale_to_zero_after_s=900
    )
    decision(model, timedelta(minutes=20), 2, 1, "0 outstanding on 2 ready replica(s): 0 each")
    decision(model, timedelta(minutes=5), 1, 0, "no request for 905 s (scale to zero after 900 s)")
    return Model.objects.get(pk=model.pk)


def test_a_model_scaled_to_zero_says_so_with_its_bounds_and_last_decision(client, idle):
    client.force_login(operator())

    html = client.get(model_url(idle)).content.decode()

    assert text(html, "model-scaling") == "scaled to zero"
    assert text(html, "model-bounds") == "0–4"
    assert text(html, "model-waiting") == "0"
    assert text(html, "model-idle") == "900 s"
    last = text(html, "model-last-decision")
    assert last.startswith("last decision 5\xa0minutes ago: 1 → 0 down,")
    assert "no request for 905 s (scale to zero after 900 s)" in last
    assert "0 outstanding on 2" not in last  # only the newest
    # every decision is a click away, in the admin's events for this model
    assert f"{reverse('admin:fleet_event_changelist')}?model_name=idle" in html
    # and the part of the page that refreshes itself says the same
    body = client.get(model_url(idle, "model-fragment")).content.decode()
    assert text(body, "model-scaling") == "scaled to zero"
    assert "1 → 0 down" in text(body, "model-last-decision")


def test_requests_waiting_for_a_model_at_zero_are_counted(client, idle):
    Model.objects.filter(pk=idle.pk).update(waiting_requests=3, desired_replicas=1)
    reason = "scaled to zero and 3 request(s) waiting: starting 1"
    decision(idle, timedelta(seconds=2), 0, 1, reason)
    client.force_login(operator())

    html = client.get(model_url(idle)).content.decode()

    assert text(html, "model-scaling") == "starting for 3 waiting requests"
    assert text(html, "model-waiting") == "3"
    assert "0 → 1 up" in text(html, "model-last-decision")
    assert "3 request(s) waiting: starting 1" in text(html, "model-last-decision")


def test_an_autoscaled_model_serving_says_its_target(client, idle):
    add_node("gpu-01")
    Model.objects.filter(pk=idle.pk).update(desired_replicas=2)
    add_replica(idle, idle.active_profile, ["gpu-01"])
    client.force_login(operator())

    html = client.get(model_url(idle)).content.decode()

    assert text(html, "model-scaling") == "autoscaled 0-4: 2 wanted"


def test_a_model_without_autoscaling_says_so(client):
    other = add_model("other")
    model = add_model("fixed", replicas=2)
    decision(other, timedelta(minutes=1), 1, 2, "another model's decision")
    client.force_login(operator())

    html = client.get(model_url(model)).content.decode()

    assert text(html, "model-scaling") == "not autoscaled"
    assert text(html, "model-bounds") == "-"
    assert text(html, "model-last-decision") == "no autoscaler decision yet"
    assert 'id="model-idle"' not in html


def test_the_cluster_page_gives_each_models_scaling(client, idle):
    add_model("fixed", replicas=2)
    client.force_login(operator())

    for url in (CLUSTER, reverse("console:cluster-fragment")):
        html = client.get(url).content.decode()
        rows = dict(
            re.findall(
                r'<tr class="model-row" data-model="([^"]+)">.*?'
                r'<td class="model-scaling">(.*?)</td>',
                html,
            )
        )
        assert rows == {"idle": "scaled to zero", "fixed": "-"}
