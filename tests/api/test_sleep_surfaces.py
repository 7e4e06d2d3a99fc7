"""Sleep as operators meet it (docs/operations.md, "Sleep and wake"): the API's fields, the
admin's form and lists, ``apply -f``. A bad value is refused naming its field, and
changes nothing."""

import re

import pytest
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from fleet.models import EngineProfile, Model, Replica, ReplicaState
from fleet.services import catalog
from tests.admin.helpers import form_data
from tests.factories import LLAMACPP_CPU, add_model

pytestmark = pytest.mark.django_db

MODELS = "/api/v1/models/"
# Sleeps after 5 idle minutes; asleep an hour, it goes to zero.
SLEEPS = {
    "min_replicas": 0,
    "max_replicas": 2,
    "desired_replicas": 0,
    "sleep_after_s": 300,
    "sleep_level": 1,
    "stop_after_asleep_s": 3600,
}


def asleep_replica(model) -> Replica:
    return Replica.objects.create(
        model=model,
        profile=model.active_profile,
        state=ReplicaState.ASLEEP,
        state_changed_at=timezone.now(),
        reason="asleep: no request for 300 s (sleep after 300 s)",
    )


# ---- the API ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"sleep_after_s": 0}, "sleep_after_s", "sleep_after_s must be at least 1"),
        (
            {"sleep_after_s": 60, "sleep_level": 3},
            "sleep_level",
            "sleep_level is 1 (weights kept in host memory) or 2 (weights dropped), not 3",
        ),
        ({"stop_after_asleep_s": 600}, "stop_after_asleep_s", "needs sleep_after_s"),
        (
            {"sleep_after_s": 60, "stop_after_asleep_s": 600},
            "stop_after_asleep_s",
            "stop_after_asleep_s needs min_replicas 0 (got none)",
        ),
        ({**SLEEPS, "stop_after_asleep_s": 0}, "stop_after_asleep_s", "must be at least 1"),
    ],
    ids=["sleep after 0", "level 3", "stop without sleep", "stop without min 0", "stop after 0"],
)
def test_bad_sleep_is_refused_naming_the_field_and_nothing_is_made(api, body, field, says):
    resp = api.post(MODELS, {"name": "m", **body}, content_type="application/json")

    assert resp.status_code == 400, resp.content
    errors = resp.json()
    assert list(errors) == [field]
    assert says in errors[field][0]
    assert not Model.objects.exists()


def test_a_model_is_given_a_sleep_policy_through_the_api_and_says_what_sleeps(api):
    # when: a model that sleeps, then goes to zero (no scale_to_zero_after_s needed)
    made = api.post(MODELS, {"name": "m", **SLEEPS}, content_type="application/json")

    # then: kept, and said in words
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["sleep_after_s"], body["sleep_level"], body["stop_after_asleep_s"]) == (
        300,
        1,
        3600,
    )
    assert body["sleep"] == "after 300 s idle, level 1, to zero after 3600 s asleep"

    # given: one of its replicas asleep, and a model that never sleeps
    model = Model.objects.get(name="m")
    model.active_profile = EngineProfile.objects.create(
        model=model, name="cpu", engine="llamacpp", model_path="/models/m.gguf", gpus_per_node=0
    )
    asleep_replica(model)
    add_model("plain")

    listed = {m["name"]: m for m in api.get(MODELS).json()["results"]}
    policy = "after 300 s idle, level 1, to zero after 3600 s asleep"
    assert listed["m"]["sleep"] == f"1 asleep; {policy}"
    assert listed["plain"]["sleep"] == ""
    assert (listed["plain"]["sleep_after_s"], listed["plain"]["sleep_level"]) == (None, 1)
    assert api.get(f"{MODELS}{model.pk}/").json()["sleep"].startswith("1 asleep; ")


def test_a_bad_patch_changes_nothing_and_a_good_one_turns_sleep_off(api):
    model = add_model("m")
    Model.objects.filter(pk=model.pk).update(sleep_after_s=60)
    url = f"{MODELS}{model.pk}/"

    bad = api.patch(url, {"sleep_after_s": 120, "sleep_level": 9}, content_type="application/json")
    assert bad.status_code == 400 and "sleep_level" in bad.json()
    assert Model.objects.filter(pk=model.pk, sleep_after_s=60, sleep_level=1).exists()

    level_two = api.patch(url, {"sleep_level": 2}, content_type="application/json")
    assert level_two.status_code == 200 and level_two.json()["sleep"] == "after 60 s idle, level 2"

    # given: a replica asleep when sleep is turned off: it says they wake
    asleep_replica(model)
    off = api.patch(url, {"sleep_after_s": None}, content_type="application/json")
    assert off.status_code == 200, off.content
    assert off.json()["sleep"] == "1 asleep; sleep is off: they wake"
    assert Model.objects.get(pk=model.pk).sleep_after_s is None


def test_the_schema_says_the_sleep_fields_and_their_bounds():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    props = schema["components"]["schemas"]["Model"]["properties"]
    assert props["sleep_after_s"]["minimum"] == 1
    assert props["stop_after_asleep_s"]["minimum"] == 1
    assert props["sleep"]["readOnly"] is True


# ---- the admin --------------------------------------------------------------------------


def admin_url(model_cls, view, *args):
    return reverse(f"admin:fleet_{model_cls._meta.model_name}_{view}", args=args)


def test_the_admin_sets_sleep_in_its_own_part_of_the_form(admin_client):
    model = add_model("chat", **LLAMACPP_CPU)
    page = admin_client.get(admin_url(Model, "change", model.pk)).content.decode()
    # a part of its own, after autoscaling's
    assert page.index("Autoscaling and scale to zero") < page.index("Sleep</h2>")
    data = form_data(page)
    assert data["sleep_after_s"] == "" and data["sleep_level"] == "1"

    resp = admin_client.post(
        admin_url(Model, "change", model.pk), {**data, "sleep_after_s": "300", "sleep_level": "2"}
    )

    assert resp.status_code == 302, resp.content.decode()[:2000]
    model.refresh_from_db()
    assert (model.sleep_after_s, model.sleep_level) == (300, 2)
    listing = admin_client.get(admin_url(Model, "changelist")).content.decode()
    assert "after 300 s idle, level 2" in listing


def test_the_admin_refuses_a_stop_without_sleep_and_saves_nothing(admin_client):
    model = add_model("chat", **LLAMACPP_CPU)
    data = form_data(admin_client.get(admin_url(Model, "change", model.pk)).content.decode())

    resp = admin_client.post(
        admin_url(Model, "change", model.pk),
        {**data, "stop_after_asleep_s": "600", "description": "changed"},
    )

    assert resp.status_code == 200
    assert "stop_after_asleep_s needs sleep_after_s" in resp.content.decode()
    model.refresh_from_db()
    assert model.stop_after_asleep_s is None and model.description == ""


def test_the_admin_lists_asleep_replicas_with_why_and_since(admin_client):
    model = add_model("chat", **LLAMACPP_CPU)
    asleep = asleep_replica(model)
    Replica.objects.create(model=model, profile=model.active_profile, state=ReplicaState.READY)

    listing = admin_client.get(
        admin_url(Replica, "changelist") + "?state__exact=asleep"
    ).content.decode()

    ids = re.findall(r'class="field-id"><a [^>]*>([^<]+)<', listing)
    assert ids == [asleep.pk]
    assert "asleep: no request for 300 s (sleep after 300 s)" in listing
    assert 'class="field-state_changed_at' in listing  # since when
    page = admin_client.get(admin_url(Replica, "change", asleep.pk)).content.decode()
    assert "asleep" in page
    model_page = admin_client.get(admin_url(Model, "change", model.pk)).content.decode()
    assert "1 asleep; sleep is off: they wake" in model_page


# ---- apply -f ---------------------------------------------------------------------------

SLEEPY = """
models:
  - name: m
    min_replicas: 0
    max_replicas: 2
    sleep_after_s: 300
    sleep_level: 2
    stop_after_asleep_s: 3600
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/m.gguf
"""


def test_apply_sets_sleep_and_a_file_without_it_takes_the_defaults_back():
    catalog.apply(SLEEPY)
    model = Model.objects.get(name="m")
    assert (model.sleep_after_s, model.sleep_level, model.stop_after_asleep_s) == (300, 2, 3600)
    assert catalog.apply(SLEEPY).changes == []

    # when: the file no longer names sleep (and goes to zero by idleness instead)
    plain = "\n".join(
        line
        for line in SLEEPY.splitlines()
        if not line.strip().startswith(("sleep_", "stop_after"))
    ).replace("max_replicas: 2", "max_replicas: 2\n    scale_to_zero_after_s: 600")
    result = catalog.apply(plain)

    # then: the file is the truth, as for every other field: the defaults, said
    model.refresh_from_db()
    assert (model.sleep_after_s, model.sleep_level, model.stop_after_asleep_s) == (None, 1, None)
    (change,) = result.changes
    assert "sleep_after_s 300 → None" in change and "sleep_level 2 → 1" in change


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("sleep_level: 2", "sleep_level: 3", "model m.sleep_level: "),
        ("sleep_after_s: 300", "sleep_after_s: 0", "model m.sleep_after_s: "),
        ("min_replicas: 0", "min_replicas: 1", "model m.stop_after_asleep_s: "),
        ("sleep_after_s: 300", "sleep_after_s: soon", "model m.sleep_after_s: "),
    ],
    ids=["level 3", "sleep after 0", "stop with min 1", "not a number"],
)
def test_apply_refuses_bad_sleep_naming_the_field_and_changes_nothing(old, new, says):
    catalog.apply(SLEEPY)

    with pytest.raises(catalog.CatalogError) as exc:
        catalog.apply(SLEEPY.replace(old, new).replace("/models/m.gguf", "/models/other.gguf"))

    assert any(e.startswith(says) for e in exc.value.errors), exc.value.errors
    model = Model.objects.get(name="m")
    assert (model.min_replicas, model.sleep_after_s, model.sleep_level) == (0, 300, 2)
    assert model.active_profile.model_path == "/models/m.gguf"


def test_the_catalog_docstring_example_applies_with_its_sleep_policy():
    example = catalog.__doc__.split("::\n", 1)[1]
    # Without "private": a private model needs a team, which the example does not name.
    text = "\n".join(line[4:] for line in example.splitlines() if "private:" not in line)

    catalog.apply(text, dry_run=True)  # raises if the example is not a valid file

    result = catalog.apply(text)
    assert "model qwen2.5-7b created" in result.changes
    model = Model.objects.get(name="qwen2.5-7b")
    assert (model.sleep_after_s, model.sleep_level, model.stop_after_asleep_s) == (300, 1, 3600)
