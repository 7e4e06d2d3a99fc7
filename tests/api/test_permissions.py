"""The management API asks for Django's model permissions, as the admin does.

A staff user (or a manage key issued for one) with no permissions can do
nothing; reads need view, writes add/change/delete, moving workload needs
drain_node, and a profile's args and env need a permission of their own.
"""

import pytest
from django.contrib.auth import get_user_model

from fleet.models import ApiKey, EngineProfile, Model, Node, WantedEngine
from fleet.services.permissions import OTHERS_API_KEYS as OTHERS
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


# ---- API keys: one's own, or the permission for others' (issue 29) -------------------------


@pytest.fixture
def superuser():
    return get_user_model().objects.create_superuser("root", password="pw-for-tests")


def test_rotating_another_users_key_needs_the_permission_for_others(acting_as, superuser):
    theirs, secret = manage_key(superuser)
    ops = grant(staff_user("ops"), "fleet.change_apikey")
    mine, _ = manage_key(ops)
    client = acting_as(ops)

    refused = call(client, "post", f"/api/v1/api-keys/{theirs.prefix}/rotate/", {"grace": "1h"})
    own = call(client, "post", f"/api/v1/api-keys/{mine.prefix}/rotate/", {"grace": "1h"})

    assert refused.status_code == 403
    assert "fleet.manage_others_api_keys" in refused.json()["detail"]
    assert "secret" not in refused.json()
    theirs.refresh_from_db()
    assert theirs.previous_secret_hash == "" and ApiKey.find(secret) == theirs
    assert own.status_code == 201, own.content


def test_the_permission_for_others_rotates_anothers_key(acting_as, superuser):
    theirs, _ = manage_key(superuser)
    client = acting_as(grant(staff_user("ops"), "fleet.change_apikey", OTHERS))

    resp = call(client, "post", f"/api/v1/api-keys/{theirs.prefix}/rotate/", {"grace": "1h"})

    assert resp.status_code == 201, resp.content


def test_a_new_key_is_the_askers_own_unless_they_may_name_another(acting_as, superuser):
    adder = grant(staff_user("adder"), "fleet.add_apikey")
    client = acting_as(adder)

    for_root = call(
        client, "post", "/api/v1/api-keys/", {"name": "k", "scope": "manage", "user": "root"}
    )
    for_nobody = call(
        client, "post", "/api/v1/api-keys/", {"name": "k", "scope": "manage", "user": "ghost"}
    )
    own = call(client, "post", "/api/v1/api-keys/", {"name": "mine"})

    assert for_root.status_code == 403 and for_nobody.status_code == 403
    assert not ApiKey.objects.filter(user=superuser).exists()
    assert own.status_code == 201, own.content
    assert ApiKey.objects.get(name="mine").user == adder


def test_the_permission_for_others_mints_a_key_for_another_user(acting_as, superuser):
    client = acting_as(grant(staff_user("keys"), "fleet.add_apikey", OTHERS))

    resp = call(
        client, "post", "/api/v1/api-keys/", {"name": "k", "scope": "manage", "user": "root"}
    )

    assert resp.status_code == 201, resp.content
    assert ApiKey.objects.get(name="k").user == superuser


def test_revoking_a_key_through_the_api_follows_the_same_rule(acting_as, superuser):
    theirs, _ = manage_key(superuser)
    ops = grant(staff_user("ops"), "fleet.change_apikey")
    mine, _ = manage_key(ops)
    client = acting_as(ops)

    refused = call(client, "post", f"/api/v1/api-keys/{theirs.prefix}/revoke/", None)
    own = call(client, "post", f"/api/v1/api-keys/{mine.prefix}/revoke/", None)

    assert refused.status_code == 403
    assert ApiKey.objects.get(pk=theirs.pk).revoked_at is None
    assert own.status_code == 200 and own.json()["revoked"] is True


# ---- catalog/apply asks what the per-object API asks (issue 29) ----------------------------

CATALOG = """\
models:
  - name: qwen-7b
    profiles:
      - name: cpu
        engine: llamacpp
        model_path: /models/qwen.gguf
{extra}"""


def apply(client, text, dry_run=False):
    return call(client, "post", "/api/v1/catalog/apply/", {"catalog": text, "dry_run": dry_run})


@pytest.fixture
def catalog_editor():
    """Every model and profile permission, and none for args/env or engines."""
    return grant(
        staff_user("catalog"),
        "fleet.view_model",
        "fleet.add_model",
        "fleet.change_model",
        "fleet.view_engineprofile",
        "fleet.add_engineprofile",
        "fleet.change_engineprofile",
    )


def test_apply_needs_set_engine_args_env_for_args_and_env(acting_as, catalog_editor):
    client = acting_as(catalog_editor)
    text = CATALOG.format(extra="        args: [--trust-remote-code]\n")

    resp = apply(client, text)
    dry = apply(client, text, dry_run=True)

    assert resp.status_code == 403 and dry.status_code == 403
    assert "fleet.set_engine_args_env" in resp.json()["detail"]
    assert "qwen-7b/cpu" in resp.json()["detail"]
    assert not Model.objects.exists()


def test_apply_records_who_set_args_and_env(acting_as, catalog_editor):
    trusted = grant(catalog_editor, "fleet.set_engine_args_env")
    client = acting_as(trusted)

    resp = apply(client, CATALOG.format(extra="        env: {OMP_NUM_THREADS: '4'}\n"))

    assert resp.status_code == 200, resp.content
    profile = EngineProfile.objects.get(name="cpu")
    assert profile.env == {"OMP_NUM_THREADS": "4"}
    assert profile.args_env_changed_by == trusted and profile.args_env_changed_at


def test_apply_needs_the_engine_permission_for_engine_versions(acting_as, catalog_editor):
    WantedEngine.objects.create(engine="vllm", version="0.11.0")
    client = acting_as(catalog_editor)

    resp = apply(client, CATALOG.format(extra="engines:\n  vllm: 0.11.2\n"))

    assert resp.status_code == 403
    assert "fleet.change_wantedengine" in resp.json()["detail"]
    assert WantedEngine.objects.get(engine="vllm").version == "0.11.0"
    assert not Model.objects.exists()

    grant(catalog_editor, "fleet.change_wantedengine")
    assert apply(client, CATALOG.format(extra="engines:\n  vllm: 0.11.2\n")).status_code == 200
    assert WantedEngine.objects.get(engine="vllm").version == "0.11.2"


def test_apply_asks_only_what_its_changes_need(acting_as):
    """Adding a model and its profile needs add_model and add_engineprofile, as the
    per-object API does; not the change permissions too."""
    adder = grant(staff_user("adder"), "fleet.add_model", "fleet.add_engineprofile")
    client = acting_as(adder)

    created = apply(client, CATALOG.format(extra=""))
    changed = apply(client, CATALOG.format(extra="").replace("/models/qwen", "/models/other"))

    assert created.status_code == 200, created.content
    assert Model.objects.filter(name="qwen-7b").exists()
    assert changed.status_code == 403
    assert "fleet.change_engineprofile" in changed.json()["detail"]
