"""What a change may reach beyond its team, through every door (docs/security.md, "Teams"):
a priority above the team's maximum, a fallback to another team's model, a key naming a
model kept to another team, a team's capacity rights set without manage_all_teams. Each
refusal names the team and the bound, and changes nothing."""

import pytest
from django.test import Client
from django.urls import reverse

from fleet.models import ApiKey, Model, Team
from fleet.services import api_keys, catalog, permissions
from tests.admin.helpers import form_data
from tests.api.test_permissions import acting_as  # noqa: F401 - a fixture
from tests.api.test_teams import fleet, member, patch, team  # noqa: F401 - fixtures
from tests.factories import bearer, grant, manage_key, operator

pytestmark = pytest.mark.django_db


def models_url(m: Model) -> str:
    return f"/api/v1/models/{m.pk}/"


# ---- priority ----------------------------------------------------------------------------


def test_a_models_priority_stays_within_its_teams_maximum_through_every_door(
    acting_as,  # noqa: F811
    fleet,  # noqa: F811
):
    Team.objects.filter(name="research").update(max_priority=20)
    client = acting_as(fleet["alice"])

    # when: alice raises llama past research's maximum of 20
    refused = patch(client, models_url(fleet["llama"]), {"priority": 50})

    # then: refused, naming the team and its bound; nothing changed
    assert refused.status_code == 400, refused.content
    said = refused.json()["priority"][0]
    assert "priority 50 is above the maximum of team 'research', 20" in said
    assert "fleet.manage_all_teams" in said
    assert Model.objects.get(name="llama").priority == 0

    # and within the bound it is hers to set
    assert patch(client, models_url(fleet["llama"]), {"priority": 20}).status_code == 200
    assert Model.objects.get(name="llama").priority == 20

    # and a catalog file is held to the same bound
    text = CATALOG.format(name="llama") + "    priority: 21\n"
    with pytest.raises(catalog.CatalogError, match="maximum of team 'research', 20"):
        catalog.apply(text, actor=fleet["alice"])
    assert Model.objects.get(name="llama").priority == 20

    # and so is the admin's form, posted back as a browser would
    browser = Client()
    browser.force_login(fleet["alice"])
    page = reverse("admin:fleet_model_change", args=[fleet["llama"].pk])
    data = form_data(browser.get(page).content.decode())
    answer = browser.post(page, {**data, "priority": "90"})
    assert answer.status_code == 200  # the form again, with the error
    assert "above the maximum of team &#x27;research&#x27;, 20" in answer.content.decode()
    assert Model.objects.get(name="llama").priority == 20


def test_a_teams_maximum_priority_and_guarantee_are_set_only_with_manage_all_teams(client, fleet):  # noqa: F811
    # given: a fleet operator who may change teams, but not manage every team
    carol = grant(member("carol"), "fleet.view_team", "fleet.change_team")
    _, secret = manage_key(carol)
    client.defaults.update(bearer(secret))
    url = f"/api/v1/teams/{fleet['research'].pk}/"

    for body in ({"max_priority": 90}, {"guaranteed_gpu_memory_gb": 40}):
        refused = patch(client, url, body)
        assert refused.status_code == 403, refused.content
        assert "of team 'research': it needs the permission" in refused.json()["detail"]
        assert "fleet.manage_all_teams" in refused.json()["detail"]
    # the quotas are still hers to change
    assert patch(client, url, {"max_gpus": 4}).status_code == 200
    research = Team.objects.get(name="research")
    assert (research.max_priority, research.guaranteed_gpu_memory_gb) == (0, None)

    # and whoever manages every team sets them
    _, boss = manage_key(operator("boss"))
    client.defaults.update(bearer(boss))
    done = patch(client, url, {"max_priority": 90, "guaranteed_gpu_memory_gb": 40})
    assert done.status_code == 200, done.content
    assert done.json()["max_priority"] == 90


def test_a_teams_bounds_cannot_be_set_below_what_it_holds(client, fleet):  # noqa: F811
    _, boss = manage_key(operator("boss"))
    client.defaults.update(bearer(boss))
    url = f"/api/v1/teams/{fleet['research'].pk}/"
    patch(client, url, {"max_priority": 60, "max_gpu_memory_gb": 80})
    Model.objects.filter(name="llama").update(priority=50)

    lowered = patch(client, url, {"max_priority": 40})
    assert lowered.status_code == 400
    assert "has models above priority 40: 'llama' (50); lower theirs first" in str(lowered.json())
    over = patch(client, url, {"guaranteed_gpu_memory_gb": 100})
    assert over.status_code == 400
    assert "100 GB guaranteed is more than the team's GPU memory quota of 80 GB" in str(over.json())
    research = Team.objects.get(name="research")
    assert (research.max_priority, research.guaranteed_gpu_memory_gb) == (60, None)


def test_a_model_of_no_team_cannot_be_kept_to_a_team(client, fleet):  # noqa: F811
    _, boss = manage_key(operator("boss"))
    client.defaults.update(bearer(boss))
    refused = patch(client, models_url(fleet["shared"]), {"private": True})
    assert refused.status_code == 400
    assert "a model of no team is the fleet's" in refused.json()["private"][0]
    assert patch(client, models_url(fleet["llama"]), {"private": True}).status_code == 200


# ---- fallbacks ---------------------------------------------------------------------------

CATALOG = """
models:
  - name: {name}
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/{name}.gguf
"""


def test_a_models_fallbacks_stay_within_its_team_and_the_fleets(acting_as, fleet):  # noqa: F811
    client = acting_as(fleet["alice"])

    # when: alice makes llama (research) fall back to vit (vision)
    refused = patch(client, models_url(fleet["llama"]), {"fallbacks": ["shared", "vit"]})

    # then: refused, naming the other team's model; nothing changed
    assert refused.status_code == 403, refused.content
    said = refused.json()["detail"]
    assert "model 'llama' of team 'research' fall back to 'vit' (team 'vision')" in said
    assert "fleet.manage_all_teams" in said
    assert Model.objects.get(name="llama").fallbacks == []

    # and the fleet's shared model, or her own team's, are hers to name
    mine = Model.objects.create(name="llama-small", team=fleet["research"])
    ok = patch(client, models_url(fleet["llama"]), {"fallbacks": ["shared", mine.name]})
    assert ok.status_code == 200, ok.content

    # and a catalog file is refused the same way, applying nothing
    text = CATALOG.format(name="llama") + "    fallbacks: [vit]\n    replicas: 3\n"
    with pytest.raises(permissions.Refused, match="fall back to 'vit' \\(team 'vision'\\)"):
        catalog.apply(text, actor=fleet["alice"])
    llama = Model.objects.get(name="llama")
    assert (llama.fallbacks, llama.desired_replicas) == (["shared", "llama-small"], 1)


def test_whoever_manages_all_teams_may_cross_and_a_member_keeps_editing(client, fleet):  # noqa: F811
    _, boss = manage_key(operator("boss"))
    client.defaults.update(bearer(boss))
    done = patch(client, models_url(fleet["llama"]), {"fallbacks": ["vit"]})
    assert done.status_code == 200, done.content

    # a member still edits the model: the fallback someone else set is judged no more
    _, mine = manage_key(fleet["alice"])
    client.defaults.update(bearer(mine))
    assert patch(client, models_url(fleet["llama"]), {"desired_replicas": 2}).status_code == 200
    # but moving the model to no team judges its fallbacks again, as the fleet's
    catalog_text = CATALOG.format(name="llama") + "    team: null\n    fallbacks: [vit]\n"
    with pytest.raises(permissions.Refused):
        catalog.apply(catalog_text, actor=fleet["alice"])


# ---- API keys ----------------------------------------------------------------------------


def test_a_key_names_no_model_kept_to_another_team(acting_as, fleet):  # noqa: F811
    Model.objects.filter(name="vit").update(private=True)
    client = acting_as(fleet["alice"])

    for body, field in (
        ({"name": "ci", "models": ["vit"]}, "allowed models"),
        ({"name": "ci", "fallbacks": ["vit"]}, "fallbacks"),
    ):
        refused = client.post("/api/v1/api-keys/", body, content_type="application/json")
        assert refused.status_code == 400, refused.content
        assert f"a key of team 'research' may not name 'vit' (team 'vision') in its {field}" in str(
            refused.json()
        )
    assert not ApiKey.objects.filter(name="ci").exists()

    # an open model of another team may be named: the key could call it anyway
    ok = client.post(
        "/api/v1/api-keys/",
        {"name": "ci", "fallbacks": ["llama"], "models": ["llama", "shared"]},
        content_type="application/json",
    )
    assert ok.status_code == 201, ok.content
    key = ApiKey.objects.get(name="ci")
    with pytest.raises(api_keys.ApiKeyError, match="may not name 'vit'"):
        api_keys.set_fallbacks(key, ["vit"], actor=fleet["alice"])

    # a key of vision's may name it
    bobs, _ = api_keys.create_api_key(
        "bob-ci", user=fleet["bob"], allowed_models=["vit"], fallbacks=[], actor=fleet["bob"]
    )
    assert bobs.allowed_models == ["vit"]
