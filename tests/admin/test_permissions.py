"""The admin asks the same permissions as the API: drain_node for moving workload,
set_engine_args_env for what runs on the nodes."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from fleet.models import ApiKey, EngineProfile, JoinToken, Model, Node
from tests.admin.helpers import form_data
from tests.factories import (
    LLAMACPP_CPU,
    add_model,
    add_node,
    grant,
    join_token,
    manage_key,
    staff_user,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def act(client, action, *node_ids):
    return client.post(
        reverse("admin:fleet_node_changelist"),
        {"action": action, "_selected_action": list(node_ids)},
    )


def test_cordon_and_drain_actions_need_drain_node(client):
    add_node("gpu-01", as_reported=True)
    client.force_login(grant(staff_user("viewer"), "fleet.view_node", "fleet.change_node"))

    page = client.get(reverse("admin:fleet_node_changelist")).content.decode()
    act(client, "cordon_nodes", "gpu-01")
    act(client, "drain_nodes", "gpu-01")

    assert "cordon_nodes" not in page and "drain_nodes" not in page
    node = Node.objects.get(pk="gpu-01")
    assert (node.cordoned, node.draining) == (False, False)


def test_the_node_form_cannot_drain_without_drain_node(client):
    add_node("gpu-01", as_reported=True)
    client.force_login(grant(staff_user("editor"), "fleet.view_node", "fleet.change_node"))
    page = reverse("admin:fleet_node_change", args=["gpu-01"])
    data = form_data(client.get(page).content.decode())

    client.post(page, {**data, "cordoned": "on", "draining": "on", "operator_labels": "{}"})

    node = Node.objects.get(pk="gpu-01")
    assert (node.cordoned, node.draining) == (False, False)


def test_drain_node_allows_the_actions(client):
    add_node("gpu-01", as_reported=True)
    client.force_login(grant(staff_user("ops"), "fleet.view_node", "fleet.drain_node"))

    act(client, "cordon_nodes", "gpu-01")

    assert Node.objects.get(pk="gpu-01").cordoned


@pytest.fixture
def profile_editor():
    return grant(
        staff_user("editor"),
        "fleet.view_model",
        "fleet.change_model",
        "fleet.view_engineprofile",
        "fleet.change_engineprofile",
    )


def post_profile(client, profile, **changes):
    page = reverse("admin:fleet_engineprofile_change", args=[profile.pk])
    data = form_data(client.get(page).content.decode())
    data.update(changes)
    return client.post(page, data)


def test_profile_form_without_the_permission_keeps_args_and_env(client, profile_editor):
    model = add_model("qwen-7b", **LLAMACPP_CPU, args=["--ctx-size", "2048"])
    profile = model.active_profile
    client.force_login(profile_editor)

    page = client.get(reverse("admin:fleet_engineprofile_change", args=[profile.pk]))
    resp = post_profile(
        client,
        profile,
        startup_timeout_s="60",
        args='["--trust-remote-code"]',
        env='{"LD_PRELOAD": "/tmp/x.so"}',
    )

    assert 'name="args"' not in page.content.decode()  # shown, not editable
    assert resp.status_code == 302
    profile.refresh_from_db()
    assert profile.startup_timeout_s == 60
    assert (profile.args, profile.env) == (["--ctx-size", "2048"], {})
    assert profile.args_env_changed_by is None


def test_profile_form_with_the_permission_records_who(client, profile_editor):
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    trusted = grant(profile_editor, "fleet.set_engine_args_env")
    client.force_login(trusted)

    resp = post_profile(client, profile, env='{"OMP_NUM_THREADS": "4"}')

    assert resp.status_code == 302
    profile.refresh_from_db()
    assert profile.env == {"OMP_NUM_THREADS": "4"}
    assert profile.args_env_changed_by == trusted and profile.args_env_changed_at


def test_model_page_inline_keeps_args_and_env_without_the_permission(client, profile_editor):
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    client.force_login(profile_editor)
    page = reverse("admin:fleet_model_change", args=[model.pk])
    data = form_data(client.get(page).content.decode())

    data["profiles-0-args"] = json.dumps(["--trust-remote-code"])
    resp = client.post(page, data)

    assert resp.status_code == 302
    assert EngineProfile.objects.get(pk=profile.pk).args == []
    assert Model.objects.get(pk=model.pk).active_profile_id == profile.pk


def test_model_page_inline_records_who_set_args(client, profile_editor):
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    trusted = grant(profile_editor, "fleet.set_engine_args_env")
    client.force_login(trusted)
    page = reverse("admin:fleet_model_change", args=[model.pk])
    data = form_data(client.get(page).content.decode())

    data["profiles-0-args"] = json.dumps(["--ctx-size", "4096"])
    resp = client.post(page, data)

    assert resp.status_code == 302
    profile.refresh_from_db()
    assert profile.args == ["--ctx-size", "4096"]
    assert profile.args_env_changed_by == trusted


# ---- keys and tokens (issue 29) --------------------------------------------------------------


@pytest.fixture
def superuser():
    return get_user_model().objects.create_superuser("root", password="pw-for-tests")


def revoke(client, model, action, *pks):
    return client.post(
        reverse(f"admin:fleet_{model}_changelist"),
        {"action": action, "_selected_action": [str(pk) for pk in pks]},
    )


def test_a_view_only_user_cannot_revoke_keys_or_join_tokens(client, superuser):
    key, _ = manage_key(superuser)
    token, _ = join_token()
    viewer = grant(staff_user("viewer"), "fleet.view_apikey", "fleet.view_jointoken")
    client.force_login(viewer)

    keys_page = client.get(reverse("admin:fleet_apikey_changelist")).content.decode()
    revoke(client, "apikey", "revoke_keys", key.pk)
    revoke(client, "jointoken", "revoke_tokens", token.pk)

    assert "revoke_keys" not in keys_page
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None
    assert JoinToken.objects.get(pk=token.pk).revoked_at is None


def test_change_join_token_revokes_join_tokens(client):
    token, _ = join_token()
    client.force_login(grant(staff_user("ops"), "fleet.view_jointoken", "fleet.change_jointoken"))

    revoke(client, "jointoken", "revoke_tokens", token.pk)

    assert JoinToken.objects.get(pk=token.pk).revoked_at is not None


def test_revoking_another_users_key_needs_the_permission_for_others(client, superuser):
    theirs, _ = manage_key(superuser)
    ops = grant(staff_user("ops"), "fleet.view_apikey", "fleet.change_apikey")
    mine, _ = manage_key(ops)
    client.force_login(ops)

    resp = revoke(client, "apikey", "revoke_keys", theirs.pk, mine.pk)
    refused = [m.message for m in resp.wsgi_request._messages]
    revoke(client, "apikey", "revoke_keys", mine.pk)

    assert "fleet.manage_others_api_keys" in refused[0]
    assert ApiKey.objects.get(pk=theirs.pk).revoked_at is None
    assert ApiKey.objects.get(pk=mine.pk).revoked_at is not None


def test_deleting_another_users_key_needs_the_permission_for_others(client, superuser):
    theirs, _ = manage_key(superuser)
    ops = grant(staff_user("ops"), "fleet.view_apikey", "fleet.delete_apikey")
    client.force_login(ops)

    resp = client.post(reverse("admin:fleet_apikey_delete", args=[theirs.pk]), {"post": "yes"})

    assert resp.status_code == 403
    assert ApiKey.objects.filter(pk=theirs.pk).exists()


def add_key(client, **fields):
    page = reverse("admin:fleet_apikey_add")
    data = form_data(client.get(page).content.decode())
    data.update({"name": "automation", "scope": "manage", **fields})
    return client.post(page, data)


def test_the_permission_to_add_keys_cannot_pick_another_owner(client, superuser):
    adder = grant(staff_user("adder"), "fleet.view_apikey", "fleet.add_apikey")
    client.force_login(adder)

    page = client.get(reverse("admin:fleet_apikey_add")).content.decode()
    resp = add_key(client, user=str(superuser.pk))

    assert resp.status_code == 200, resp.content  # the secret, once
    assert 'name="user"' not in page
    assert not ApiKey.objects.filter(user=superuser).exists()
    assert ApiKey.objects.get(name="automation").user == adder


def test_the_permission_for_others_picks_a_keys_owner(client, superuser):
    admin_of_keys = grant(
        staff_user("keys"),
        "fleet.view_apikey",
        "fleet.add_apikey",
        "fleet.manage_others_api_keys",
    )
    client.force_login(admin_of_keys)

    resp = add_key(client, user=str(superuser.pk))

    assert resp.status_code == 200, resp.content
    assert ApiKey.objects.get(name="automation").user == superuser


def test_a_keys_fallbacks_are_named_in_the_admin_and_a_wrong_one_is_refused(client, superuser):
    Model.objects.create(name="small")
    client.force_login(superuser)

    refused = add_key(client, scope="inference", fallbacks='["ghost"]')
    assert refused.status_code == 200 and "no model named &#x27;ghost&#x27;" in (
        refused.content.decode()
    )
    assert not ApiKey.objects.exists()

    made = add_key(client, scope="inference", fallbacks='["small"]')
    assert made.status_code == 200, made.content
    key = ApiKey.objects.get(name="automation")
    assert key.fallbacks == ["small"]

    # and changed on the key's page: the gateways' copy is rung
    page = reverse("admin:fleet_apikey_change", args=[key.pk])
    data = form_data(client.get(page).content.decode())
    data["fallbacks"] = "[]"
    assert client.post(page, data).status_code == 302
    key.refresh_from_db()
    assert key.fallbacks == []
