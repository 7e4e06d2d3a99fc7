"""Autoscaling as operators meet it: the API's fields and events, the admin, ``apply -f``."""

import pytest
from django.utils import timezone

from fleet.models import Event, EventKind, Model
from fleet.services import catalog
from tests.factories import add_model, staff_user

pytestmark = pytest.mark.django_db


def test_a_model_is_created_autoscaled_through_the_api_and_bad_bounds_name_the_field(api):
    # when: bounds that do not fit together
    bad = api.post(
        "/api/v1/models/",
        {"name": "m", "min_replicas": 0, "max_replicas": 2},
        content_type="application/json",
    )
    # then: refused, naming the field and what is missing; nothing created
    assert bad.status_code == 400
    assert "scale_to_zero_after_s" in bad.json()["scale_to_zero_after_s"][0]
    assert not Model.objects.exists()

    # when: good bounds
    ok = api.post(
        "/api/v1/models/",
        {
            "name": "m",
            "desired_replicas": 0,
            "min_replicas": 0,
            "max_replicas": 2,
            "scale_to_zero_after_s": 600,
        },
        content_type="application/json",
    )
    assert ok.status_code == 201, ok.content
    assert ok.json()["scaling"] == "scaled to zero"


def test_the_api_says_a_model_is_starting_for_waiting_requests_and_lists_the_decisions(api):
    model = add_model("m", replicas=1)
    Model.objects.filter(pk=model.pk).update(
        min_replicas=0, max_replicas=2, scale_to_zero_after_s=60, waiting_requests=3
    )
    Event.objects.create(
        created_at=timezone.now(),
        kind=EventKind.AUTOSCALE,
        model=model,
        model_name="m",
        direction="up",
        from_replicas=0,
        to_replicas=1,
        reason="scaled to zero and 3 request(s) waiting: starting 1",
    )
    add_model("plain", replicas=2)

    models = {m["name"]: m for m in api.get("/api/v1/models/").json()["results"]}
    assert models["m"]["scaling"] == "starting for 3 waiting requests"
    assert models["m"]["waiting_requests"] == 3
    assert models["plain"]["scaling"] == ""  # no autoscaling: as before

    (event,) = api.get("/api/v1/events/", {"model": model.pk}).json()["results"]
    assert (event["direction"], event["from_replicas"], event["to_replicas"]) == ("up", 0, 1)
    assert "3 request(s) waiting" in event["reason"]


def test_the_admin_shows_scaling_and_the_events(client):
    model = add_model("m", replicas=0)
    Model.objects.filter(pk=model.pk).update(
        min_replicas=0, max_replicas=2, scale_to_zero_after_s=60
    )
    Event.objects.create(
        created_at=timezone.now(),
        kind=EventKind.AUTOSCALE,
        model=model,
        model_name="m",
        direction="down",
        from_replicas=1,
        to_replicas=0,
        reason="no request for 61 s (scale to zero after 60 s)",
    )
    client.force_login(staff_user(is_superuser=True))

    assert "scaled to zero" in client.get("/admin/fleet/model/").content.decode()
    assert "scaled to zero" in client.get(f"/admin/fleet/model/{model.pk}/change/").content.decode()
    events = client.get("/admin/fleet/event/").content.decode()
    assert "no request for 61 s" in events


AUTOSCALED = """
models:
  - name: m
    min_replicas: 0
    max_replicas: 4
    scale_to_zero_after_s: 300
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/m.gguf
"""


def test_apply_sets_the_bounds_and_a_re_apply_leaves_the_autoscalers_target_alone():
    catalog.apply(AUTOSCALED)
    model = Model.objects.get(name="m")
    assert (model.min_replicas, model.max_replicas, model.scale_to_zero_after_s) == (0, 4, 300)
    # given: the autoscaler moved it to 3
    Model.objects.filter(pk=model.pk).update(desired_replicas=3)

    result = catalog.apply(AUTOSCALED)

    assert Model.objects.get(name="m").desired_replicas == 3
    assert result.changes == []


def test_apply_refuses_bounds_that_do_not_fit_and_changes_nothing():
    with pytest.raises(catalog.CatalogError) as exc:
        catalog.apply(AUTOSCALED.replace("max_replicas: 4", "max_replicas: 0"))
    assert any("max_replicas" in e and "at least 1" in e for e in exc.value.errors)
    assert not Model.objects.exists()
