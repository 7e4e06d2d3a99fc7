"""/v1/files and /v1/batches through Django's views: shapes, refusals, owners, and the
checks a batch goes through before it runs."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from fleet.models import ApiKeyScope, Batch, BatchFile
from fleet.services.batches import runner
from tests.batches.helpers import jsonl, key, team
from tests.factories import add_model, bearer, manage_key

pytestmark = pytest.mark.django_db


def upload(client, secret, content: bytes, name="in.jsonl", purpose="batch"):
    return client.post(
        "/v1/files",
        {"file": SimpleUploadedFile(name, content), "purpose": purpose},
        **bearer(secret),
    )


def create(client, secret, file_id, endpoint="/v1/chat/completions", **extra):
    return client.post(
        "/v1/batches",
        json.dumps(
            {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h", **extra}
        ),
        content_type="application/json",
        **bearer(secret),
    )


def error_of(resp) -> dict:
    return resp.json()["error"]


def test_a_file_is_uploaded_listed_read_and_deleted(
    client, batch_storage, django_capture_on_commit_callbacks
):
    _, secret = key("client")
    content = jsonl(3)

    resp = upload(client, secret, content)
    assert resp.status_code == 200, resp.content
    made = resp.json()
    assert made["object"] == "file" and made["id"].startswith("file-")
    assert (made["bytes"], made["filename"], made["purpose"]) == (len(content), "in.jsonl", "batch")
    assert BatchFile.objects.get(pk=made["id"]).lines == 3

    listed = client.get("/v1/files", **bearer(secret)).json()
    assert [f["id"] for f in listed["data"]] == [made["id"]]
    assert listed["has_more"] is False
    assert client.get(f"/v1/files/{made['id']}", **bearer(secret)).json() == made
    body = client.get(f"/v1/files/{made['id']}/content", **bearer(secret))
    assert b"".join(body.streaming_content) == content

    with django_capture_on_commit_callbacks(execute=True):
        gone = client.delete(f"/v1/files/{made['id']}", **bearer(secret))
    assert gone.json() == {"id": made["id"], "object": "file", "deleted": True}
    assert client.get(f"/v1/files/{made['id']}", **bearer(secret)).status_code == 404
    assert list(batch_storage.iterdir()) == []


def test_a_bad_line_is_a_400_naming_it_and_nothing_is_kept(client, batch_storage):
    _, secret = key("client")
    content = jsonl(2) + b'{"custom_id": "q-3", "method": "POST", "url": "/v1/chat/completions"}\n'

    resp = upload(client, secret, content)

    assert resp.status_code == 400
    err = error_of(resp)
    assert err["message"] == "in.jsonl: line 3: 'body' must be a JSON object: the request to send"
    assert (err["param"], err["code"], err["type"]) == (
        "body",
        "invalid_batch_line",
        "invalid_request_error",
    )
    assert not BatchFile.objects.exists()
    assert not batch_storage.exists() or list(batch_storage.iterdir()) == []


@pytest.mark.parametrize(
    "fields, status, says",
    [
        ({"purpose": "fine-tune"}, 400, "'purpose' must be 'batch'"),
        ({"expires_after[anchor]": "created_at"}, 400, "does not take expires_after[anchor]"),
    ],
)
def test_what_a_file_upload_refuses(client, fields, status, says):
    _, secret = key("client")
    data = {"file": SimpleUploadedFile("in.jsonl", jsonl(1)), "purpose": "batch", **fields}
    resp = client.post("/v1/files", data, **bearer(secret))
    assert resp.status_code == status
    assert says in error_of(resp)["message"]


def test_a_file_over_the_size_bound_is_a_413(client, settings):
    settings.LLMGW = {**settings.LLMGW, "BATCH_FILE_MAX_BYTES": 100}
    _, secret = key("client")
    resp = upload(client, secret, jsonl(3))
    assert resp.status_code == 413
    assert error_of(resp)["code"] == "request_too_large"


def test_keys_are_checked_as_the_gateway_checks_them(client):
    assert client.get("/v1/files").status_code == 401
    assert error_of(client.get("/v1/files"))["code"] == "missing_api_key"
    bad = client.get("/v1/files", **bearer("lgk_12345678_nope"))
    assert (bad.status_code, error_of(bad)["code"]) == (401, "invalid_api_key")
    _, manage = manage_key()
    wrong = client.get("/v1/batches", **bearer(manage))
    assert (wrong.status_code, error_of(wrong)["code"]) == (403, "wrong_key_scope")
    row, secret = key("client")
    row.revoked_at = row.created_at
    row.save()
    revoked = client.get("/v1/batches", **bearer(secret))
    assert (revoked.status_code, error_of(revoked)["code"]) == (401, "revoked_api_key")
    assert ApiKeyScope.INFERENCE == row.scope


def test_another_teams_key_sees_nothing_of_a_teams_files_and_batches(client):
    research, vision = team("research"), team("vision")
    _, alice = key("alice", research)
    _, bob = key("bob", research)
    _, eve = key("eve", vision)
    _, loner = key("loner")
    add_model("tiny")
    file_id = upload(client, alice, jsonl(2)).json()["id"]
    batch_id = create(client, alice, file_id).json()["id"]

    # a teammate's key shares them
    assert client.get(f"/v1/files/{file_id}", **bearer(bob)).status_code == 200
    assert client.get(f"/v1/batches/{batch_id}", **bearer(bob)).status_code == 200
    # another team's key, and a key of no team, find nothing: 404, as for what does not exist
    for stranger in (eve, loner):
        for method, path in (
            ("get", f"/v1/files/{file_id}"),
            ("get", f"/v1/files/{file_id}/content"),
            ("delete", f"/v1/files/{file_id}"),
            ("get", f"/v1/batches/{batch_id}"),
            ("post", f"/v1/batches/{batch_id}/cancel"),
        ):
            resp = getattr(client, method)(path, **bearer(stranger))
            assert resp.status_code == 404, (method, path)
        assert client.get("/v1/files", **bearer(stranger)).json()["data"] == []
        assert client.get("/v1/batches", **bearer(stranger)).json()["data"] == []
        assert create(client, stranger, file_id).status_code == 404
    assert BatchFile.objects.filter(pk=file_id).exists()
    assert Batch.objects.get(pk=batch_id).status == "validating"


def test_a_batch_is_created_validating_with_openais_fields(client):
    _, secret = key("client")
    file_id = upload(client, secret, jsonl(5)).json()["id"]

    resp = create(client, secret, file_id, metadata={"job": "nightly"})

    assert resp.status_code == 200, resp.content
    made = resp.json()
    assert made["object"] == "batch" and made["id"].startswith("batch_")
    assert made["status"] == "validating"
    assert made["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
    assert made["input_file_id"] == file_id
    assert made["expires_at"] - made["created_at"] == 24 * 3600
    assert made["metadata"] == {"job": "nightly"}
    assert client.get(f"/v1/batches/{made['id']}", **bearer(secret)).json() == made
    assert [b["id"] for b in client.get("/v1/batches", **bearer(secret)).json()["data"]] == [
        made["id"]
    ]


@pytest.mark.parametrize(
    "change, status, says, param",
    [
        ({"endpoint": "/v1/embeddings"}, 400, "line 1 of file", "endpoint"),
        ({"endpoint": "/v1/models"}, 400, "'endpoint' must be one of", "endpoint"),
        (
            {"completion_window": "1h"},
            400,
            "'completion_window' must be \"24h\"",
            "completion_window",
        ),
        ({"input_file_id": "file-nope"}, 404, "file file-nope does not exist", "input_file_id"),
        ({"metadata": {"k": 7}}, 400, "'metadata' keys are at most", "metadata"),
        ({"output_expires_after": {"anchor": "created_at", "seconds": 3600}}, 400, "", None),
    ],
)
def test_what_creating_a_batch_refuses(client, change, status, says, param):
    _, secret = key("client")
    file_id = upload(client, secret, jsonl(2)).json()["id"]
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    resp = client.post(
        "/v1/batches",
        json.dumps({**body, **change}),
        content_type="application/json",
        **bearer(secret),
    )
    assert resp.status_code == status
    assert says in error_of(resp)["message"]
    if param:
        assert error_of(resp)["param"] == param
    assert not Batch.objects.exists()


def test_beat_starts_a_batch_whose_models_exist_and_fails_one_that_names_others(client):
    add_model("tiny")
    _, secret = key("client")
    good = create(client, secret, upload(client, secret, jsonl(2)).json()["id"]).json()
    bad_file = upload(client, secret, jsonl(2) + jsonl(1, model="ghost").replace(b"q-1", b"x-1"))
    bad = create(client, secret, bad_file.json()["id"]).json()
    limited_row, limited = key("limited")
    limited_row.allowed_models = ["other"]
    limited_row.save()
    refused = create(client, limited, upload(client, limited, jsonl(1)).json()["id"]).json()

    owners = runner.tick()

    assert Batch.objects.get(pk=good["id"]).status == "in_progress"
    failed = client.get(f"/v1/batches/{bad['id']}", **bearer(secret)).json()
    assert failed["status"] == "failed" and failed["failed_at"]
    assert failed["errors"]["data"] == [
        {
            "code": "model_not_found",
            "message": "model 'ghost' does not exist",
            "param": "body.model",
            "line": 3,
        }
    ]
    no = client.get(f"/v1/batches/{refused['id']}", **bearer(limited)).json()
    assert no["errors"]["data"][0]["code"] == "model_not_allowed"
    assert owners == [f"key:{Batch.objects.get(pk=good['id']).api_key_id}"]


def test_cancel_moves_a_batch_to_cancelling_once_and_refuses_a_finished_one(client):
    _, secret = key("client")
    batch_id = create(client, secret, upload(client, secret, jsonl(2)).json()["id"]).json()["id"]

    first = client.post(f"/v1/batches/{batch_id}/cancel", **bearer(secret)).json()
    again = client.post(f"/v1/batches/{batch_id}/cancel", **bearer(secret)).json()

    assert first["status"] == again["status"] == "cancelling"
    assert first["cancelling_at"] == again["cancelling_at"]
    Batch.objects.filter(pk=batch_id).update(status="completed")
    late = client.post(f"/v1/batches/{batch_id}/cancel", **bearer(secret))
    assert late.status_code == 409
    assert "is completed" in error_of(late)["message"]


def test_an_input_file_cannot_be_deleted_under_a_running_batch(client):
    _, secret = key("client")
    file_id = upload(client, secret, jsonl(2)).json()["id"]
    create(client, secret, file_id)
    resp = client.delete(f"/v1/files/{file_id}", **bearer(secret))
    assert resp.status_code == 409
    assert error_of(resp)["code"] == "file_in_use"


def test_lists_page_newest_first_by_cursor(client):
    _, secret = key("client")
    ids = [upload(client, secret, jsonl(1)).json()["id"] for _ in range(5)]
    first = client.get("/v1/files?limit=2", **bearer(secret)).json()
    assert [f["id"] for f in first["data"]] == ids[::-1][:2] and first["has_more"]
    rest = client.get(f"/v1/files?limit=10&after={first['last_id']}", **bearer(secret)).json()
    assert [f["id"] for f in rest["data"]] == ids[::-1][2:] and not rest["has_more"]
    oldest = client.get("/v1/files?order=asc&limit=1", **bearer(secret)).json()
    assert oldest["data"][0]["id"] == ids[0]
    assert client.get("/v1/files?limit=0", **bearer(secret)).status_code == 400


def test_unknown_paths_and_methods_answer_in_openais_shape(client):
    _, secret = key("client")
    resp = client.get("/v1/files/a/b/c", **bearer(secret))
    assert (resp.status_code, error_of(resp)["code"]) == (404, "unknown_url")
    wrong = client.put("/v1/batches", **bearer(secret))
    assert wrong.status_code == 405 and "takes GET or POST" in error_of(wrong)["message"]
