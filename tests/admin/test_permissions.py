"""The admin asks the same permissions as the API: drain_node for moving workload,
set_engine_args_env for what runs on the nodes."""

import json

import pytest
from django.urls import reverse

from fleet.models import EngineProfile, Model, Node
from tests.admin.helpers import form_data
from tests.factories import LLAMACPP_CPU, add_model, add_node, grant, staff_user

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
