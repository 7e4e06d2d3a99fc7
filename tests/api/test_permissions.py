"""The management API asks for Django's model permissions, as the admin does.

A staff user (or a manage key issued for one) with no permissions can do
nothing; reads need view, writes add/change/delete, moving workload needs
drain_node, and a profile's args and env need a permission of their own.
"""

import pytest

from fleet.models import EngineProfile, Node
from tests.factories import LLAMACPP_CPU, add_model, add_node, bearer, grant, manage_key, staff_user

pytestmark = pytest.mark.django_db

PROFILE = {
    "name": "cpu2",
    "engine": "llamacpp",
    "model_path": "/models/qwen.gguf",
}


def as_key(client, user):
    _, secret = manage_key(user)
    client.defaults.update(bearer(secret))
    return client


def as_session(client, user):
    client.force_login(user)
    return client


@pytest.fixture(params=[as_key, as_session], ids=["manage key", "session"])
def acting_as(request, client):
    """A client acting as a given user, by a manage key of theirs or their admin session."""
    return lambda user: request.param(client, user)


def writes(model_pk):
    """Every write the outside probe made as a staff user with no permissions."""
    return [
        ("post", "/api/v1/models/", {"name": "new-model"}),
        ("patch", f"/api/v1/models/{model_pk}/", {"desired_replicas": 3}),
        ("post", "/api/v1/nodes/gpu-01/cordon/", None),
        ("post", "/api/v1/nodes/gpu-01/drain/", None),
        ("post", "/api/v1/nodes/gpu-01/uncordon/", None),
        ("post", "/api/v1/engine-profiles/", {**PROFILE, "model": model_pk}),
        ("delete", f"/api/v1/models/{model_pk}/", None),
    ]


def call(client, method, path, body):
    return getattr(client, method)(path, body, content_type="application/json")


def test_staff_without_permissions_can_neither_read_nor_write(acting_as):
    add_node("gpu-01", as_reported=True)
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    client = acting_as(staff_user("nobody"))

    reads = [client.get(f"/api/v1/{name}/").status_code for name in ("nodes", "models")]
    refused = {path: call(client, m, path, body).status_code for m, path, body in writes(model.pk)}

    assert reads == [403, 403]
    assert set(refused.values()) == {403}, refused
    node = Node.objects.get(pk="gpu-01")
    assert (node.cordoned, node.draining) == (False, False)
    assert list(EngineProfile.objects.values_list("name", flat=True)) == ["cpu"]


def test_view_permission_reads_and_writes_nothing(acting_as):
    add_node("gpu-01", as_reported=True)
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    user = grant(staff_user("viewer"), "fleet.view_node", "fleet.view_model")
    client = acting_as(user)

    assert client.get("/api/v1/nodes/").status_code == 200
    assert client.get("/api/v1/models/").status_code == 200
    assert client.get(f"/api/v1/models/{model.pk}/explain/").status_code == 200
    assert client.get("/api/v1/engine-profiles/").status_code == 403
    assert call(client, "post", "/api/v1/models/", {"name": "x"}).status_code == 403
    assert call(client, "post", "/api/v1/nodes/gpu-01/cordon/", None).status_code == 403


def test_add_model_permission_adds_a_model(acting_as):
    client = acting_as(grant(staff_user("adder"), "fleet.add_model"))

    resp = call(client, "post", "/api/v1/models/", {"name": "new-model"})

    assert resp.status_code == 201, resp.content


def test_cordon_and_drain_need_drain_node_not_change_node(acting_as):
    add_node("gpu-01", as_reported=True)
    editor = grant(staff_user("editor"), "fleet.view_node", "fleet.change_node")
    client = acting_as(editor)

    assert call(client, "post", "/api/v1/nodes/gpu-01/cordon/", None).status_code == 403
    assert not Node.objects.get(pk="gpu-01").cordoned

    grant(editor, "fleet.drain_node")
    for action in ("cordon", "drain"):
        resp = call(client, "post", f"/api/v1/nodes/gpu-01/{action}/", None)
        assert resp.status_code == 200, resp.content
    node = Node.objects.get(pk="gpu-01")
    assert (node.cordoned, node.draining) == (True, True)


@pytest.fixture
def profile_editor():
    """A staff user who may edit profiles but not their args and env."""
    return grant(
        staff_user("editor"),
        "fleet.view_engineprofile",
        "fleet.add_engineprofile",
        "fleet.change_engineprofile",
    )


@pytest.mark.parametrize(
    "body",
    [
        {"env": {"LD_PRELOAD": "/tmp/x.so"}},
        {"args": ["--trust-remote-code"]},
    ],
    ids=["env", "args"],
)
def test_changing_args_or_env_needs_its_own_permission(acting_as, profile_editor, body):
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    client = acting_as(profile_editor)

    resp = call(client, "patch", f"/api/v1/engine-profiles/{profile.pk}/", body)

    assert resp.status_code == 403
    assert "fleet.set_engine_args_env" in resp.json()["detail"]
    profile.refresh_from_db()
    assert (profile.args, profile.env) == ([], {})


def test_a_new_profile_with_env_needs_the_permission(acting_as, profile_editor):
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    client = acting_as(profile_editor)

    with_env = {**PROFILE, "model": model.pk, "env": {"PYTHONPATH": "/tmp"}}
    plain = {**PROFILE, "model": model.pk, "name": "plain", "args": [], "env": {}}

    assert call(client, "post", "/api/v1/engine-profiles/", with_env).status_code == 403
    assert call(client, "post", "/api/v1/engine-profiles/", plain).status_code == 201


def test_other_fields_and_unchanged_args_need_no_extra_permission(acting_as, profile_editor):
    model = add_model("qwen-7b", **LLAMACPP_CPU, args=["--ctx-size", "2048"])
    profile = model.active_profile
    client = acting_as(profile_editor)

    resp = call(
        client,
        "patch",
        f"/api/v1/engine-profiles/{profile.pk}/",
        {"startup_timeout_s": 60, "args": ["--ctx-size", "2048"]},
    )

    assert resp.status_code == 200, resp.content
    assert resp.json()["args_env_changed_by"] is None


def test_who_set_args_and_env_is_recorded(acting_as, profile_editor):
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    trusted = grant(profile_editor, "fleet.set_engine_args_env")
    client = acting_as(trusted)

    resp = call(
        client, "patch", f"/api/v1/engine-profiles/{profile.pk}/", {"env": {"OMP_NUM_THREADS": "4"}}
    )

    assert resp.status_code == 200, resp.content
    profile.refresh_from_db()
    assert profile.env == {"OMP_NUM_THREADS": "4"}
    assert profile.args_env_changed_by == trusted
    assert profile.args_env_changed_at is not None
    assert resp.json()["args_env_changed_by"] == trusted.pk
