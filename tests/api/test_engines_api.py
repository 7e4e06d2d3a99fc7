"""Wanted engines and a node's vLLM build through the API and the command: what an operator
sends, what they get back, and clear errors for bad input (docs/engines.md)."""

import io

import pytest
from django.core.management import CommandError, call_command

from fleet.models import Node, WantedEngine
from tests.factories import add_node, bearer, grant, manage_key, staff_user

pytestmark = pytest.mark.django_db


def test_wanted_engines_are_listed_added_changed_and_removed(api):
    resp = api.post("/api/v1/engines/", {"engine": "vllm", "version": "0.11.2"},
                    content_type="application/json")  # fmt: skip
    assert resp.status_code == 201, resp.content
    row = resp.json()
    assert (row["engine"], row["version"]) == ("vllm", "0.11.2")

    resp = api.patch(f"/api/v1/engines/{row['id']}/", {"version": "0.11.3"},
                     content_type="application/json")  # fmt: skip
    assert resp.status_code == 200 and resp.json()["version"] == "0.11.3"
    assert [e["engine"] for e in api.get("/api/v1/engines/").json()["results"]] == ["vllm"]

    assert api.delete(f"/api/v1/engines/{row['id']}/").status_code == 204
    assert not WantedEngine.objects.exists()


@pytest.mark.parametrize(
    "body, field, says",
    [
        ({"engine": "vlm", "version": "0.11.2"}, "engine", "not a valid choice"),
        ({"engine": "fake", "version": "1"}, "engine", "not a valid choice"),
        ({"engine": "vllm", "version": "0.11 2; rm"}, "version", "a version, like 0.11.2"),
        ({"engine": "vllm"}, "version", "required"),
    ],
)
def test_a_bad_wanted_engine_is_refused_naming_the_field(api, body, field, says):
    resp = api.post("/api/v1/engines/", body, content_type="application/json")
    assert resp.status_code == 400
    assert says in " ".join(resp.json()[field])


def test_a_nodes_build_is_set_through_the_api_and_shown_with_its_installs(api):
    add_node("gpu-07", provision=[{"engine": "vllm", "version": "0.11.2", "variant": "cu13",
                                   "state": "installing", "detail": "downloading",
                                   "progress_percent": 42}])  # fmt: skip
    resp = api.post("/api/v1/nodes/gpu-07/vllm-build/", {"vllm_build": "cu129"},
                    content_type="application/json")  # fmt: skip
    assert resp.status_code == 200, resp.content
    node = resp.json()
    assert node["vllm_build"] == "cu129"
    assert node["engine_installs"] == [
        {"engine": "vllm", "version": "0.11.2", "variant": "cu13", "state": "installing",
         "progress_percent": 42, "detail": "downloading"}
    ]  # fmt: skip

    resp = api.post("/api/v1/nodes/gpu-07/vllm-build/", {"vllm_build": "cu118"},
                    content_type="application/json")  # fmt: skip
    assert resp.status_code == 400
    assert resp.json()["vllm_build"] == [
        "'cu118' is not a vLLM build; one of auto, cu13, cu129, cpu, none"
    ]
    assert Node.objects.get(pk="gpu-07").vllm_build == "cu129"


def test_setting_a_build_needs_change_node(client):
    add_node("gpu-07")
    user = grant(staff_user("viewer"), "fleet.view_node")
    _, secret = manage_key(user)
    resp = client.post("/api/v1/nodes/gpu-07/vllm-build/", {"vllm_build": "none"},
                       content_type="application/json", **bearer(secret))  # fmt: skip
    assert resp.status_code == 403
    assert Node.objects.get(pk="gpu-07").vllm_build == "auto"


def test_engine_build_command():
    add_node("gpu-07")
    out = io.StringIO()
    call_command("engine_build", "gpu-07", "cu129", stdout=out)
    assert out.getvalue() == "node 'gpu-07': vLLM build cu129 (told at once)\n"
    out = io.StringIO()
    call_command("engine_build", "gpu-07", "cu129", stdout=out)
    assert out.getvalue() == "node 'gpu-07' already has vLLM build cu129\n"
    with pytest.raises(CommandError, match="invalid choice: 'cu118'"):
        call_command("engine_build", "gpu-07", "cu118")
    with pytest.raises(CommandError, match="gpu-99"):
        call_command("engine_build", "gpu-99", "auto")
