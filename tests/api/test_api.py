"""The management API under /api/v1/: auth, inventory, catalog CRUD and its rules."""

import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from fleet.models import ApiKey, ApiKeyScope, EngineProfile, Model, Node
from fleet.services import api_keys
from fleet.services.reconciler import ask
from tests.factories import (
    LLAMACPP_CPU,
    add_model,
    add_node,
    add_replica,
    bearer,
    manage_key,
    operator,
    report_load,
    staff_user,
)

pytestmark = pytest.mark.django_db

PROFILE = {
    "name": "tp8",
    "engine": "vllm",
    "tp": 8,
    "pp": 1,
    "gpus_per_node": 8,
    "nodes": 1,
    "model_path": "meta-llama/Llama-3.1-70B-Instruct",
    "args": ["--max-model-len", "32768"],
    "env": {"VLLM_USE_V1": "1"},
    "node_selector": "zone=a,!spot",
    "min_memory_gb": 256,
}


def results(resp):
    assert resp.status_code == 200, resp.content
    return resp.json()["results"]


# --- authentication -------------------------------------------------------------


def test_manage_key_authenticates_and_is_stamped(client):
    key, secret = manage_key()

    resp = client.get("/api/v1/nodes/", **bearer(secret))

    assert resp.status_code == 200
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_no_credentials_is_401(client):
    resp = client.get("/api/v1/nodes/")
    assert resp.status_code == 401
    assert resp["WWW-Authenticate"] == "Bearer"


def test_inference_key_is_refused(client):
    _, secret = api_keys.create_api_key("chat-app", scope=ApiKeyScope.INFERENCE)

    resp = client.get("/api/v1/nodes/", **bearer(secret))

    assert resp.status_code == 401
    assert "needs a manage key" in resp.json()["detail"]


def test_revoked_and_expired_keys_are_refused(client):
    revoked, revoked_secret = manage_key()
    api_keys.revoke_api_key(revoked)
    expired, expired_secret = manage_key(operator("ops2"))
    ApiKey.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(1))

    r1 = client.get("/api/v1/nodes/", **bearer(revoked_secret))
    r2 = client.get("/api/v1/nodes/", **bearer(expired_secret))

    # the management API says it as the gateway does (fleet.models.access.api_key_refusal)
    assert (r1.status_code, r1.json()["detail"]) == (
        401,
        f"API key '{revoked.name}' ({revoked.prefix}) has been revoked",
    )
    assert (r2.status_code, r2.json()["detail"]) == (
        401,
        f"API key '{expired.name}' ({expired.prefix}) has expired",
    )


def test_unknown_or_malformed_key_is_refused(client):
    assert client.get("/api/v1/nodes/", **bearer("lgk_00000000_nope")).status_code == 401
    resp = client.get("/api/v1/nodes/", HTTP_AUTHORIZATION="Bearer a b")
    assert resp.status_code == 401


def test_key_of_a_user_no_longer_staff_is_forbidden(client):
    ops = operator()
    _, secret = manage_key(ops)
    ops.is_staff = False
    ops.save()

    assert client.get("/api/v1/nodes/", **bearer(secret)).status_code == 403


def test_staff_session_works(admin_client):
    assert admin_client.get("/api/v1/models/").status_code == 200


# --- nodes and GPUs --------------------------------------------------------------


def test_node_as_the_agent_reported_it(api):
    add_node("gpu-01", as_reported=True)
    add_node("old-01", gpus=[], memory_total_mb=None, as_reported=True)
    report_load("gpu-01", cpu_percent=41.0)
    report_load("old-01", age=timedelta(minutes=5))

    nodes = {n["id"]: n for n in results(api.get("/api/v1/nodes/"))}

    gpu = nodes["gpu-01"]
    assert len(gpu["gpus"]) == 8 and gpu["gpus"][3]["pci_bus_id"] == "00000000:48:00.0"
    assert gpu["memory_total_mb"] == 2063500 and gpu["state"] == "ready"
    assert gpu["load"]["cpu_percent"] == 41.0 and gpu["load"]["cpu_count"] == 224
    assert gpu["fabrics"] == [{"fabric": "ib0", "hcas": ["mlx5_0", "mlx5_1"], "rate_gbps": 400}]
    old = nodes["old-01"]
    assert old["memory_total_mb"] is None  # unknown, not 0
    assert old["load"] is None  # five minutes old: not a fact about now
    assert old["gpus"] == []


def test_node_filters(api):
    add_node("gpu-01", as_reported=True)
    add_node("gpu-02", labels={"zone": "b"}, as_reported=True)
    Node.objects.filter(pk="gpu-02").update(cordoned=True)

    def ids(query):
        return [n["id"] for n in results(api.get("/api/v1/nodes/" + query))]

    assert ids("?cordoned=true") == ["gpu-02"]
    assert ids("?selector=zone=a") == ["gpu-01"]
    assert ids("?search=gpu-02") == ["gpu-02"]
    bad = api.get("/api/v1/nodes/?selector=zone=a,=b")
    assert bad.status_code == 400
    assert "'=b' is not a valid selector term" in bad.json()["selector"][0]


def test_cordon_and_uncordon(api, django_capture_on_commit_callbacks):
    add_node("gpu-01", as_reported=True)
    Node.objects.filter(pk="gpu-01").update(draining=True)

    cordoned = api.post("/api/v1/nodes/gpu-01/cordon/")
    assert cordoned.status_code == 200 and cordoned.json()["cordoned"] is True
    assert Node.objects.get(pk="gpu-01").cordoned

    with django_capture_on_commit_callbacks() as after_commit:
        uncordoned = api.post("/api/v1/nodes/gpu-01/uncordon/")
    assert uncordoned.status_code == 200
    # replicas waiting for room may fit now: a reconciler pass is asked for
    assert ask.request_reconcile_now in after_commit
    node = Node.objects.get(pk="gpu-01")
    assert not node.cordoned and not node.draining  # uncordon ends a drain


def test_cordon_an_unknown_node_is_404(api):
    assert api.post("/api/v1/nodes/nope/cordon/").status_code == 404


def test_nodes_are_read_only(api):
    add_node("gpu-01", as_reported=True)
    resp = api.patch("/api/v1/nodes/gpu-01/", {"hostname": "x"}, content_type="application/json")
    assert resp.status_code == 405
    assert Node.objects.get(pk="gpu-01").hostname == "gpu-01.example"


def test_gpus(api):
    add_node("gpu-01", as_reported=True)
    add_node("cpu-01", gpus=[], as_reported=True)
    from fleet.models import GPU

    GPU.objects.filter(node_id="gpu-01", index=5).update(problems=["xid 79: fell off the bus"])

    assert len(results(api.get("/api/v1/gpus/?node=gpu-01"))) == 8
    sick = results(api.get("/api/v1/gpus/?healthy=false"))
    assert [(g["node"], g["index"], g["healthy"]) for g in sick] == [("gpu-01", 5, False)]
    assert len(results(api.get("/api/v1/gpus/?healthy=true"))) == 7


# --- catalog CRUD and Model.clean() rules ---------------------------------------


def _post(api, path, body):
    return api.post(path, body, content_type="application/json")


def test_a_models_fallbacks_must_name_other_models_that_exist(api):
    _post(api, "/api/v1/models/", {"name": "small"})

    bad = _post(api, "/api/v1/models/", {"name": "big", "fallbacks": ["small", "smal"]})
    assert bad.status_code == 400
    assert bad.json() == {"fallbacks": ["no model named 'smal'"]}
    assert not Model.objects.filter(name="big").exists()

    good = _post(api, "/api/v1/models/", {"name": "big", "fallbacks": ["small"]})
    assert good.status_code == 201 and good.json()["fallbacks"] == ["small"]


def test_model_and_profile_crud(api):
    model = _post(api, "/api/v1/models/", {"name": "Qwen/Qwen2.5-7B", "desired_replicas": 2})
    assert model.status_code == 201, model.content
    mid = model.json()["id"]

    profile = _post(api, "/api/v1/engine-profiles/", {**PROFILE, "model": mid})
    assert profile.status_code == 201, profile.content
    pid = profile.json()["id"]
    assert profile.json()["gpus_total"] == 8 and profile.json()["model_name"] == "Qwen/Qwen2.5-7B"

    patched = api.patch(
        f"/api/v1/models/{mid}/", {"active_profile": pid}, content_type="application/json"
    )
    assert patched.status_code == 200 and patched.json()["active_profile"] == pid
    assert Model.objects.get(pk=mid).active_profile_id == pid

    put = api.put(
        f"/api/v1/engine-profiles/{pid}/",
        {**PROFILE, "model": mid, "tp": 4, "pp": 2},
        content_type="application/json",
    )
    assert put.status_code == 200 and EngineProfile.objects.get(pk=pid).pp == 2

    listed = results(api.get("/api/v1/engine-profiles/?model_name=Qwen/Qwen2.5-7B"))
    assert [p["id"] for p in listed] == [pid]

    assert api.delete(f"/api/v1/engine-profiles/{pid}/").status_code == 204
    assert api.delete(f"/api/v1/models/{mid}/").status_code == 204
    assert not Model.objects.exists()


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"tp": 4}, "tp", "tp × pp (4 × 1 = 4) must equal gpus_per_node × nodes (8 × 1 = 8)"),
        ({"engine": "tensorrt"}, "engine", "unknown engine 'tensorrt'; choose one of vllm"),
        ({"node_selector": "zone=a,=b"}, "node_selector", "'=b' is not a valid selector term"),
        (
            {"gpus_per_node": 0, "engine": "sglang"},
            "gpus_per_node",
            "SGLang needs at least one GPU",
        ),
        ({"args": "--tp 8"}, "args", "args must be a list of strings"),
        ({"env": {"A": 1}}, "env", "env must map names to string values"),
        ({"tp": 0}, "tp", "greater than or equal to 1"),
        (
            {"gpus_per_node": 0, "engine": "llamacpp", "tp": 1, "gpu_memory_gb": 8},
            "gpu_memory_gb",
            "a share of GPU memory needs GPUs: set gpus_per_node to 1 or more",
        ),
        ({"gpu_memory_gb": 4096}, "gpu_memory_gb", "less than or equal to 1024"),
        (
            {"engine": "sglang", "gpus_per_node": 0, "tp": 1, "nodes": 2},
            "nodes",
            "a CPU profile (gpus_per_node 0) runs on one node; only llama.cpp spreads one",
        ),
        ({"gpu_memory_gb": 0}, "gpu_memory_gb", "greater than or equal to 0.001"),
    ],
)
def test_profile_rules_give_field_errors(api, change, field, words):
    model = Model.objects.create(name="llama-70b")

    resp = _post(api, "/api/v1/engine-profiles/", {**PROFILE, "model": model.pk, **change})

    assert resp.status_code == 400
    errors = resp.json()
    assert field in errors, errors
    # A map's errors are nested under the key that is wrong ({"env": {"A": [...]}}).
    msgs = errors[field]
    msgs = [m for v in msgs.values() for m in v] if isinstance(msgs, dict) else msgs
    assert any(words in msg for msg in msgs), errors
    assert not EngineProfile.objects.exists()


def test_a_llamacpp_profile_spreads_over_nodes_without_gpus(api):
    model = Model.objects.create(name="llama-70b")
    body = {**PROFILE, "engine": "llamacpp", "gpus_per_node": 0, "tp": 1, "nodes": 2}

    resp = _post(api, "/api/v1/engine-profiles/", {**body, "model": model.pk})

    assert resp.status_code == 201, resp.json()
    assert EngineProfile.objects.get().nodes == 2


def test_profile_update_is_checked_against_the_whole_row(api):
    fields = {k: v for k, v in PROFILE.items() if k != "name"}
    profile = add_model("llama-70b", profile="cpu", **fields).active_profile

    # tp alone is fine by itself; with the stored gpus_per_node it is not.
    resp = api.patch(
        f"/api/v1/engine-profiles/{profile.pk}/", {"tp": 2}, content_type="application/json"
    )

    assert resp.status_code == 400 and "tp" in resp.json()
    assert EngineProfile.objects.get(pk=profile.pk).tp == 8


def test_prefix_routing_is_off_by_default_and_switched_per_model(api):
    created = _post(api, "/api/v1/models/", {"name": "chat"})
    assert created.status_code == 201 and created.json()["prefix_routing"] is False
    mid = created.json()["id"]

    on = api.patch(f"/api/v1/models/{mid}/", {"prefix_routing": True}, "application/json")
    assert on.status_code == 200 and on.json()["prefix_routing"] is True
    assert Model.objects.get(pk=mid).prefix_routing is True

    bad = api.patch(f"/api/v1/models/{mid}/", {"prefix_routing": "sometimes"}, "application/json")
    assert bad.status_code == 400
    assert bad.json()["prefix_routing"] == ["Must be a valid boolean."]
    assert Model.objects.get(pk=mid).prefix_routing is True


def test_a_profile_cannot_move_to_another_model(api):
    profile = add_model("qwen-7b", **LLAMACPP_CPU).active_profile
    other = Model.objects.create(name="llama-8b")

    resp = api.patch(
        f"/api/v1/engine-profiles/{profile.pk}/",
        {"model": other.pk},
        content_type="application/json",
    )

    assert resp.status_code == 400
    assert "belongs to model 'qwen-7b'" in resp.json()["model"][0]
    assert EngineProfile.objects.get(pk=profile.pk).model.name == "qwen-7b"


def test_negative_replicas_is_a_field_error(api):
    model = add_model("qwen-7b", **LLAMACPP_CPU)

    created = _post(api, "/api/v1/models/", {"name": "m2", "desired_replicas": -1})
    patched = api.patch(
        f"/api/v1/models/{model.pk}/", {"desired_replicas": -3}, content_type="application/json"
    )

    assert created.status_code == 400
    assert created.json() == {"desired_replicas": ["replicas cannot be negative"]}
    assert patched.status_code == 400 and "desired_replicas" in patched.json()
    assert Model.objects.get(pk=model.pk).desired_replicas == 1


def test_active_profile_of_another_model_is_refused(api):
    other_profile = add_model("other", **LLAMACPP_CPU).active_profile
    model = add_model("mine", **LLAMACPP_CPU)

    patched = api.patch(
        f"/api/v1/models/{model.pk}/",
        {"active_profile": other_profile.pk},
        content_type="application/json",
    )
    created = _post(api, "/api/v1/models/", {"name": "new", "active_profile": other_profile.pk})

    assert patched.status_code == 400
    assert patched.json()["active_profile"] == ["profile 'cpu' belongs to another model"]
    assert created.status_code == 400 and "active_profile" in created.json()


def test_bad_model_name_and_duplicates(api):
    add_model("qwen-7b", **LLAMACPP_CPU)

    bad = _post(api, "/api/v1/models/", {"name": "-bad name"})
    dup = _post(api, "/api/v1/models/", {"name": "qwen-7b"})

    assert bad.status_code == 400 and "name" in bad.json()
    # A taken name is a conflict with what exists, not a malformed request.
    assert dup.status_code == 409 and "name" in dup.json()
    assert Model.objects.count() == 1


def test_deleting_a_profile_in_use_is_a_conflict(api):
    add_node("gpu-01", as_reported=True)
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    add_replica(model, profile, ["gpu-01"])

    resp = api.delete(f"/api/v1/engine-profiles/{profile.pk}/")

    assert resp.status_code == 409
    assert "in use by 1 object(s)" in resp.json()["detail"]
    assert EngineProfile.objects.filter(pk=profile.pk).exists()


# --- replicas and shards ---------------------------------------------------------


def test_replicas_and_shards_are_readable_not_writable(api):
    add_node("gpu-01", as_reported=True)
    add_node("gpu-02", as_reported=True)
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    profile = model.active_profile
    replica = add_replica(model, profile, ["gpu-01", "gpu-02"])

    replicas = results(api.get(f"/api/v1/replicas/?model_name={model.name}"))
    shards = results(api.get("/api/v1/shards/?node=gpu-02"))

    assert [r["id"] for r in replicas] == [replica.pk]
    assert [s["node"] for s in replicas[0]["shards"]] == ["gpu-01", "gpu-02"]
    assert [(s["replica"], s["rank"], s["state"]) for s in shards] == [(replica.pk, 1, "ready")]
    assert _post(api, "/api/v1/replicas/", {"model": model.pk}).status_code == 405
    assert api.delete(f"/api/v1/shards/{shards[0]['id']}/").status_code == 405


# --- OpenAPI ---------------------------------------------------------------------


def test_schema_lists_the_node_endpoints(api):
    resp = api.get("/api/schema/", HTTP_ACCEPT="application/json")

    assert resp.status_code == 200
    paths = resp.json()["paths"]
    assert "/api/v1/nodes/" in paths and "/api/v1/nodes/{id}/cordon/" in paths
    assert "/api/v1/engine-profiles/" in paths
    schemes = resp.json()["components"]["securitySchemes"]
    assert schemes["apiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schemes["apiKey"]["description"],
    }


def test_schema_generates_without_warnings(tmp_path):
    # --fail-on-warn turns any drf-spectacular warning (an unresolvable field,
    # an enum name collision, an unknown authenticator) into an error.
    call_command(
        "spectacular", "--fail-on-warn", "--validate", "--file", str(tmp_path / "schema.yaml")
    )
    assert "/api/v1/nodes/{id}/uncordon/" in (tmp_path / "schema.yaml").read_text()


# --- end to end: a real web process, a real agent socket ---------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.live
def test_an_enrolled_agent_appears_in_nodes_the_api_and_the_admin(live_web):
    import json
    import subprocess
    import sys
    import urllib.parse
    import urllib.request
    from http.cookiejar import CookieJar

    from django.contrib.auth.hashers import PBKDF2PasswordHasher
    from websockets.sync.client import connect

    from tests.factories import join_token, register_msg
    from tests.processes import ROOT, subprocess_env

    # given an agent that enrols with a join token over a real socket
    _, token = join_token()
    _, key = manage_key()
    root = staff_user("root", is_superuser=True)
    # The web process runs with the real hashers, which do not know this module's fast one.
    root.password = PBKDF2PasswordHasher().encode("pw-for-tests", "salt4tests", iterations=1000)
    root.save()
    headers = {"Authorization": f"Bearer {token}"}
    with connect(live_web.ws_url, additional_headers=headers, open_timeout=10) as ws:
        ws.send(json.dumps(register_msg("gpu-07")))
        ack = json.loads(ws.recv(timeout=10))
        assert ack["of"] == "register" and ack["credential"].startswith("lgn_")

        # then `manage.py nodes` in another process lists it
        nodes = subprocess.run(
            [sys.executable, "manage.py", "nodes"],
            cwd=ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert nodes.returncode == 0, nodes.stderr
        line = next(x for x in nodes.stdout.splitlines() if x.startswith("gpu-07"))
        assert line.split()[:2] == ["gpu-07", "ready"]
        assert "2063.5" in line and "8×H100" in line

        # and the API answers with its GPUs and memory
        req = urllib.request.Request(
            live_web.url + "/api/v1/nodes/gpu-07/",
            headers={"Authorization": f"Bearer {key}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            node = json.load(resp)
        assert node["connected"] and node["memory_total_mb"] == 2063500
        assert len(node["gpus"]) == 8

        # and so does the admin, to a superuser who logs in
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        login = live_web.url + "/admin/login/"
        page = opener.open(login, timeout=10).read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = {"username": "root", "password": "pw-for-tests", "csrfmiddlewaretoken": csrf}
        opener.open(
            urllib.request.Request(
                login + "?next=/admin/",
                urllib.parse.urlencode(form).encode(),
                headers={"Referer": login},
            ),
            timeout=10,
        )
        admin_page = (
            opener.open(live_web.url + "/admin/fleet/node/gpu-07/change/", timeout=10)
            .read()
            .decode()
        )
        assert admin_page.count("NVIDIA H100 80GB HBM3") == 8


def test_a_node_not_keeping_up_says_so(api):
    add_node("gpu-01", mgmt_interface="eno1")
    add_node("gpu-02")
    Node.objects.filter(pk="gpu-02").update(
        desired_version=3, desired_lag_since=timezone.now() - timedelta(seconds=31)
    )

    nodes = {n["id"]: n for n in results(api.get("/api/v1/nodes/"))}

    assert nodes["gpu-01"]["not_keeping_up"] is False
    assert nodes["gpu-01"]["mgmt_interface"] == "eno1"
    assert nodes["gpu-02"]["not_keeping_up"] is True
    assert nodes["gpu-02"]["desired_lag_since"] is not None
    # read-only: an operator cannot clear it
    resp = api.patch(
        "/api/v1/nodes/gpu-02/", {"not_keeping_up": False}, content_type="application/json"
    )
    assert resp.status_code in (200, 405)
    assert Node.objects.get(pk="gpu-02").desired_lag_since is not None


def test_a_filter_value_with_a_percent_sign_is_a_400_naming_it(api):
    # django-filter %-formats its errors: a '%' in what was asked must not make it a 500
    for query in ("cordoned=%25s%25", "selector=%25zone", "connected=100%25"):
        resp = api.get(f"/api/v1/nodes/?{query}")
        assert resp.status_code == 400, (query, resp.content)
    assert "not '100%'" in api.get("/api/v1/nodes/?connected=100%25").json()["connected"][0]


def test_a_canary_promotion_takes_a_reason_and_refuses_a_bad_one(api):
    from fleet.models import EngineProfile

    model = _post(api, "/api/v1/models/", {"name": "qwen"}).json()
    fp8 = EngineProfile.objects.create(
        model_id=model["id"], name="fp8", engine="llamacpp", model_path="/m.gguf"
    )
    Model.objects.filter(pk=model["id"]).update(canary_profile=fp8, canary_percent=10)
    path = f"/api/v1/models/{model['id']}/promote/"

    bad = _post(api, path, {"why": "x" * 501})
    assert bad.status_code == 400 and "why" in bad.json()
    assert Model.objects.get(pk=model["id"]).canary_profile_id == fp8.pk

    done = _post(api, path, {"why": "p95 within bounds"})
    assert done.status_code == 200
    assert done.json()["detail"].endswith("promoted by user 'ops': p95 within bounds")
    assert _post(api, path, {}).status_code == 409
