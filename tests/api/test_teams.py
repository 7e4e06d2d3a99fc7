"""Teams through every door: a member changes their team's models and keys, sees the
rest read-only, and a refusal names whose it is and changes nothing."""

import re

import pytest
from django.contrib.auth.models import Group, Permission
from django.urls import reverse

from fleet.models import ApiKey, EngineProfile, Model, Team
from fleet.services import api_keys, catalog, permissions
from tests.api.test_permissions import PROFILE, acting_as  # noqa: F401 - a fixture
from tests.factories import LLAMACPP_CPU, add_model, bearer, manage_key, operator, staff_user

pytestmark = pytest.mark.django_db

# What a team's group grants: managing models, profiles and keys (a member's own).
MEMBER_PERMS = [
    "view_model",
    "add_model",
    "change_model",
    "delete_model",
    "view_engineprofile",
    "add_engineprofile",
    "change_engineprofile",
    "view_apikey",
    "add_apikey",
    "change_apikey",
    "manage_others_api_keys",
]


def team(name: str, **quotas) -> Team:
    group = Group.objects.create(name=name)
    group.permissions.set(
        Permission.objects.filter(content_type__app_label="fleet", codename__in=MEMBER_PERMS)
    )
    return Team.objects.create(name=name, group=group, **quotas)


def member(username: str, *teams: Team):
    user = staff_user(username)
    user.groups.set([t.group for t in teams])
    return user


@pytest.fixture
def fleet():
    """Two teams with a model each, a model of no team, and a member of each team."""
    research, vision = team("research"), team("vision")
    llama = add_model("llama", **LLAMACPP_CPU)
    vit = add_model("vit", **LLAMACPP_CPU)
    add_model("shared", **LLAMACPP_CPU)
    Model.objects.filter(pk=llama.pk).update(team=research)
    Model.objects.filter(pk=vit.pk).update(team=vision)
    return {
        "research": research,
        "vision": vision,
        "alice": member("alice", research),
        "bob": member("bob", vision),
        "llama": Model.objects.get(name="llama"),
        "vit": Model.objects.get(name="vit"),
        "shared": Model.objects.get(name="shared"),
    }


def patch(client, path, body):
    return client.patch(path, body, content_type="application/json")


def test_a_member_changes_their_teams_model_and_reads_the_others(acting_as, fleet):  # noqa: F811
    client = acting_as(fleet["alice"])
    assert (
        patch(client, f"/api/v1/models/{fleet['llama'].pk}/", {"desired_replicas": 3}).status_code
        == 200
    )
    assert Model.objects.get(name="llama").desired_replicas == 3

    # Another team's model: visible, and read-only.
    assert client.get(f"/api/v1/models/{fleet['vit'].pk}/").json()["team"] == "vision"
    refused = patch(client, f"/api/v1/models/{fleet['vit'].pk}/", {"desired_replicas": 5})
    assert refused.status_code == 403
    assert "belongs to team 'vision'" in refused.json()["detail"]
    assert "they are in team 'research'" in refused.json()["detail"]
    assert client.delete(f"/api/v1/models/{fleet['vit'].pk}/").status_code == 403
    # The fleet's own model is not a member's either.
    refused = patch(client, f"/api/v1/models/{fleet['shared'].pk}/", {"desired_replicas": 5})
    assert refused.status_code == 403
    assert "belongs to no team" in refused.json()["detail"]

    assert Model.objects.get(name="vit").desired_replicas == 1
    assert Model.objects.get(name="shared").desired_replicas == 1


def test_a_members_new_model_is_their_teams_and_cannot_be_given_away(acting_as, fleet):  # noqa: F811
    client = acting_as(fleet["alice"])
    made = client.post("/api/v1/models/", {"name": "mistral"}, content_type="application/json")
    assert made.status_code == 201, made.content
    assert made.json()["team"] == "research"

    given = client.post(
        "/api/v1/models/", {"name": "gift", "team": "vision"}, content_type="application/json"
    )
    assert given.status_code == 403
    assert "give model 'gift' to team 'vision'" in given.json()["detail"]
    moved = patch(client, f"/api/v1/models/{fleet['llama'].pk}/", {"team": "vision"})
    assert moved.status_code == 403
    assert not Model.objects.filter(name="gift").exists()
    assert Model.objects.get(name="llama").team.name == "research"


def test_a_member_adds_no_profile_to_another_teams_model(acting_as, fleet):  # noqa: F811
    client = acting_as(fleet["alice"])
    body = {**PROFILE, "model": fleet["vit"].pk}
    refused = client.post("/api/v1/engine-profiles/", body, content_type="application/json")
    assert refused.status_code == 403
    assert "add a profile to model 'vit'" in refused.json()["detail"]
    profile = fleet["vit"].active_profile
    assert patch(client, f"/api/v1/engine-profiles/{profile.pk}/", {"tp": 2}).status_code == 403
    assert EngineProfile.objects.filter(model=fleet["vit"]).count() == 1

    ok = client.post(
        "/api/v1/engine-profiles/",
        {**PROFILE, "model": fleet["llama"].pk},
        content_type="application/json",
    )
    assert ok.status_code == 201, ok.content


def test_whoever_manages_all_teams_changes_every_model(client, fleet):
    _, secret = manage_key(operator("ops"))  # every fleet permission, manage_all_teams too
    client.defaults.update(bearer(secret))
    for name in ("llama", "vit", "shared"):
        pk = fleet[name].pk
        assert patch(client, f"/api/v1/models/{pk}/", {"desired_replicas": 2}).status_code == 200
    moved = patch(client, f"/api/v1/models/{fleet['shared'].pk}/", {"team": "vision"})
    assert moved.status_code == 200
    assert Model.objects.get(name="shared").team.name == "vision"


def test_api_keys_belong_to_a_team_and_only_its_members_revoke_them(acting_as, fleet):  # noqa: F811
    bobs, _ = api_keys.create_api_key("bob-ci", user=fleet["bob"], actor=fleet["bob"])
    assert bobs.team == fleet["vision"]

    client = acting_as(fleet["alice"])
    made = client.post("/api/v1/api-keys/", {"name": "alice-ci"}, content_type="application/json")
    assert made.status_code == 201, made.content
    assert ApiKey.objects.get(prefix=made.json()["prefix"]).team == fleet["research"]

    # alice may manage others' keys, but not another team's.
    refused = client.post(f"/api/v1/api-keys/{bobs.prefix}/revoke/")
    assert refused.status_code == 403
    assert "belongs to team 'vision'" in refused.json()["detail"]
    refused = patch(client, f"/api/v1/api-keys/{bobs.prefix}/", {"requests_per_minute": 1})
    assert refused.status_code == 403
    bobs.refresh_from_db()
    assert bobs.revoked_at is None and bobs.requests_per_minute is None

    given = client.post(
        "/api/v1/api-keys/", {"name": "gift", "team": "vision"}, content_type="application/json"
    )
    assert given.status_code == 403
    unknown = client.post(
        "/api/v1/api-keys/", {"name": "x", "team": "nope"}, content_type="application/json"
    )
    assert unknown.status_code == 400
    assert "no team named 'nope'" in str(unknown.json())
    assert not ApiKey.objects.filter(name__in=["gift", "x"]).exists()


def test_a_member_in_two_teams_names_the_team_of_a_new_key(fleet):
    carol = member("carol", fleet["research"], fleet["vision"])
    with pytest.raises(permissions.Refused, match="is in teams 'research', 'vision': name the"):
        api_keys.create_api_key("ci", user=carol, actor=carol)
    key, _ = api_keys.create_api_key("ci", user=carol, team=fleet["vision"], actor=carol)
    assert key.team == fleet["vision"]


CATALOG = """
models:
  - name: {name}
    replicas: {replicas}
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/{name}.gguf
"""


def test_a_catalog_file_touching_another_teams_model_applies_nothing(fleet):
    both = CATALOG.format(name="llama", replicas=4) + CATALOG.format(
        name="vit", replicas=4
    ).replace("models:\n", "")
    with pytest.raises(permissions.Refused, match="belongs to team 'vision'.*nothing applied"):
        catalog.apply(both, actor=fleet["alice"])
    assert Model.objects.get(name="llama").desired_replicas == 1

    done = catalog.apply(CATALOG.format(name="llama", replicas=4), actor=fleet["alice"])
    assert done.changes
    new = catalog.apply(CATALOG.format(name="gemma", replicas=1), actor=fleet["alice"])
    assert "model gemma created" in new.changes
    assert Model.objects.get(name="gemma").team == fleet["research"]
    with pytest.raises(catalog.CatalogError, match="no team named 'nope'"):
        catalog.apply(
            CATALOG.format(name="gemma", replicas=1) + "    team: nope\n", actor=fleet["alice"]
        )


def test_teams_api_shows_members_quotas_and_use(client, fleet):
    _, secret = manage_key(operator("ops"))
    client.defaults.update(bearer(secret))
    made = client.post(
        "/api/v1/teams/",
        {"name": "platform", "max_gpus": 8, "tokens_per_month": 1_000_000},
        content_type="application/json",
    )
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["group"] == "platform"  # made with the team
    assert body["in_use"] == {
        "gpus": 0,
        "gpu_memory_gb": 0.0,
        "replicas": 0,
        "tokens_this_month": 0,
    }
    listed = {t["name"]: t for t in client.get("/api/v1/teams/").json()["results"]}
    assert listed["research"]["members"] == ["alice"]
    taken = client.post(
        "/api/v1/teams/", {"name": "again", "group": "research"}, content_type="application/json"
    )
    assert taken.status_code == 400
    assert "group 'research' is team 'research' already" in str(taken.json())


def test_in_the_admin_another_teams_model_is_read_only_and_a_new_one_is_the_members(client, fleet):
    client.force_login(fleet["alice"])
    theirs = reverse("admin:fleet_model_change", args=[fleet["vit"].pk])
    page = client.get(theirs).content.decode()
    assert "View model" in page and 'name="_save"' not in page
    refused = client.post(theirs, {"name": "vit", "desired_replicas": "9"})
    assert refused.status_code == 403
    assert Model.objects.get(name="vit").desired_replicas == 1

    ours = client.get(reverse("admin:fleet_model_change", args=[fleet["llama"].pk]))
    assert 'name="_save"' in ours.content.decode()
    add = client.get(reverse("admin:fleet_model_add")).content.decode()
    choices = re.findall(
        r'<option value="(\d+)"[^>]*>([^<]+)</option>',
        add.split('id="id_team"')[1].split("</select>")[0],
    )
    assert [name for _, name in choices] == ["research"]  # only their own team to give it to


def test_the_admin_makes_a_new_teams_group_unless_one_is_chosen(admin_client, fleet):
    add = reverse("admin:fleet_team_add")
    made = admin_client.post(add, {"name": "platform", "max_gpus": "8"})
    assert made.status_code == 302
    assert Team.objects.get(name="platform").group.name == "platform"

    taken = admin_client.post(add, {"name": "research"})
    assert taken.status_code == 200  # the form again, with why
    assert "team with this name already exists" in taken.content.decode().lower()
    Group.objects.create(name="ml")
    Team.objects.create(name="ml-old", group=Group.objects.get(name="ml"))
    clash = admin_client.post(add, {"name": "ml"})
    assert "group &#x27;ml&#x27; is team &#x27;ml-old&#x27; already" in clash.content.decode()
    assert not Team.objects.filter(name="ml").exists()
