"""What the OpenAPI schema promises, and the API keeping those promises, one by one.

tests/api/test_api_fuzz.py holds the whole API to its schema with schemathesis
(live, a minute); these are the rules it found broken, each as a plain request
here so `make test-fast` catches a regression too.
"""

import pytest
from drf_spectacular.generators import SchemaGenerator

from tests.factories import LLAMACPP_CPU, add_model, add_node

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema():
    return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            yield path, method, op


def test_every_operation_documents_its_errors_with_their_bodies(schema):
    for path, method, op in operations(schema):
        statuses = set(op["responses"])
        assert {"401", "403", "429"} <= statuses, (method, path)
        if "{id}" in path:
            assert "404" in statuses, (method, path)
        if "requestBody" in op:
            assert {"400", "409", "415"} <= statuses, (method, path)
        for status, response in op["responses"].items():
            if int(status) >= 400:
                assert response["content"]["application/json"]["schema"]["$ref"], (status, path)
    components = schema["components"]["schemas"]
    assert components["Error"]["required"] == ["detail"]


def test_the_schema_describes_the_api_not_itself(schema):
    assert "/api/schema/" not in schema["paths"]
    assert all(path.startswith("/api/v1/") for path in schema["paths"])


def test_main_operations_carry_examples(schema):
    create_model = schema["paths"]["/api/v1/models/"]["post"]
    create_profile = schema["paths"]["/api/v1/engine-profiles/"]["post"]
    explain = schema["paths"]["/api/v1/models/{id}/explain/"]["get"]
    node = schema["paths"]["/api/v1/nodes/{id}/"]["get"]
    assert node["responses"]["200"]["content"]["application/json"]["examples"]
    assert create_model["requestBody"]["content"]["application/json"]["examples"]
    assert create_profile["requestBody"]["content"]["application/json"]["examples"]
    assert explain["responses"]["200"]["content"]["application/json"]["examples"]


def test_a_filter_value_of_the_wrong_type_is_refused_not_ignored(api):
    add_node("gpu-01")

    resp = api.get("/api/v1/nodes/?cordoned=maybe")

    assert resp.status_code == 400
    assert resp.json() == {"cordoned": ["must be true or false, not 'maybe'"]}
    assert api.get("/api/v1/nodes/?cordoned=").json()["count"] == 1  # empty: no filter
    assert api.get("/api/v1/nodes/?state__in=ready,bogus").status_code == 400


def test_an_id_filter_that_matches_nothing_is_an_empty_page(api):
    add_model("qwen-7b", **LLAMACPP_CPU)

    resp = api.get("/api/v1/engine-profiles/?model=999")

    assert resp.status_code == 200 and resp.json()["count"] == 0
    # past what a database integer holds: refused as the schema's maximum says, not a 500
    assert api.get(f"/api/v1/replicas/?model={2**64}").status_code == 400


@pytest.mark.parametrize("query", ["limit=0", "limit=abc", "limit=1001", "offset=-1", "offset=1.5"])
def test_a_bad_page_is_refused_not_replaced_by_the_default(api, query):
    resp = api.get(f"/api/v1/nodes/?{query}")

    assert resp.status_code == 400
    assert set(resp.json()) <= {"limit", "offset"}


def test_a_body_that_is_not_json_is_unsupported(api):
    resp = api.post("/api/v1/models/", {"name": "qwen-7b"})  # multipart, as a form sends

    assert resp.status_code == 415
    assert "detail" in resp.json()


def test_text_fields_take_text_only(api):
    resp = api.post("/api/v1/models/", {"name": 7}, content_type="application/json")

    assert resp.status_code == 400 and "name" in resp.json()


def test_an_unknown_path_under_the_api_is_a_json_404(api):
    resp = api.get("/api/v1/gpus/not-a-number/")

    assert resp.status_code == 404
    assert resp.json() == {"detail": "Not found."}
