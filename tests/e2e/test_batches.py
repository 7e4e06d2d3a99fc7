"""The Batch API over real processes, driven by the official ``openai`` SDK unmodified:
the web process (uvicorn) takes the files and batches, beat and a Celery worker run
them through the gateway to llama.cpp, and another team's key finds none of it.
"""

import http.client
import json

import openai
import pytest

from tests.batches.helpers import jsonl, key, team
from tests.e2e.helpers import apply_model, batch_stack, wait_serving

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stack(transactional_db, tmp_path):
    """The e2e stack, its workers sending batch lines to its own web process."""
    with batch_stack(tmp_path, LLMGW_BATCH_TICK_S="0.5", LLMGW_BATCH_SLICE_S="5") as s:
        yield s


def used_by(api_key) -> int:
    from django.db.models import Sum

    from fleet.models import KeyUsage

    return KeyUsage.objects.filter(key=api_key).aggregate(n=Sum("requests"))["n"] or 0


def wait_status(stack, client, batch_id: str, statuses: set[str], timeout: float = 180):
    return stack.wait(
        lambda: (b := client.batches.retrieve(batch_id)).status in statuses and b,
        f"batch {batch_id} to be {' or '.join(sorted(statuses))}",
        timeout,
    )


def test_a_batch_runs_through_the_gateway_and_only_its_team_sees_it(stack, tiny_model):
    # given: llama.cpp serving tiny-llama, a model with no replica, and two teams' keys
    stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    apply_model(stack, tiny_model, name="idle-llama", replicas=0)
    wait_serving(stack)
    research_key, research_secret = key("research batch", team("research"))
    _, vision_secret = key("vision batch", team("vision"))
    research = stack.openai(research_secret, timeout=30)
    vision = stack.openai(vision_secret, timeout=30)

    # when: research uploads 20 lines and runs them as a batch
    upload = research.files.create(
        file=("questions.jsonl", jsonl(20, "tiny-llama")), purpose="batch"
    )
    batch = research.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "e2e"},
    )
    assert batch.status == "validating"
    done = wait_status(stack, research, batch.id, {"completed", "failed", "expired"})

    # then: every custom_id answered once, by the engine, through the gateway
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed) == (20, 20)
    assert done.request_counts.failed == 0 and done.error_file_id is None
    lines = [json.loads(x) for x in research.files.content(done.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in lines) == sorted(f"q-{i}" for i in range(1, 21))
    for line in lines:
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["object"] == "chat.completion"
        assert line["response"]["body"]["usage"]["completion_tokens"] >= 1
    assert batch.id in [b.id for b in research.batches.list()]
    assert research.files.retrieve(done.output_file_id).purpose == "batch_output"
    # as the key's own requests: its usage counts them (the gateways write it in batches)
    stack.wait(lambda: used_by(research_key) >= 20, "the batch's requests in its key's usage", 60)

    # when: a batch of Responses requests, which llama.cpp answers as chat completions
    asks = research.files.create(
        file=("responses.jsonl", jsonl(3, "tiny-llama", url="/v1/responses")), purpose="batch"
    )
    answered = wait_status(
        stack,
        research,
        research.batches.create(
            input_file_id=asks.id, endpoint="/v1/responses", completion_window="24h"
        ).id,
        {"completed", "failed", "expired"},
    )

    # then: each line's answer is a Response object
    assert (answered.status, answered.request_counts.completed) == ("completed", 3), answered
    for line in research.files.content(answered.output_file_id).text.splitlines():
        body = json.loads(line)["response"]["body"]
        assert body["object"] == "response" and body["status"] in ("completed", "incomplete")
        assert body["usage"]["output_tokens"] >= 1

    # when: a batch for the model with no ready replica waits, and is cancelled
    idle = research.files.create(file=("idle.jsonl", jsonl(3, "idle-llama")), purpose="batch")
    waiting = research.batches.create(
        input_file_id=idle.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_status(stack, research, waiting.id, {"in_progress"})
    cancelling = research.batches.cancel(waiting.id)
    assert cancelling.status in ("cancelling", "cancelled")
    cancelled = wait_status(stack, research, waiting.id, {"cancelled"})
    assert cancelled.request_counts.completed == 0 and cancelled.output_file_id is None

    # then: another team's key finds neither the files nor the batches
    for call in (
        lambda: vision.files.retrieve(upload.id),
        lambda: vision.files.content(upload.id),
        lambda: vision.files.delete(upload.id),
        lambda: vision.files.content(done.output_file_id),
        lambda: vision.batches.retrieve(batch.id),
        lambda: vision.batches.cancel(waiting.id),
        lambda: vision.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(vision.batches.list()) == [] and list(vision.files.list()) == []
    # and research still has its file
    assert research.files.retrieve(upload.id).filename == "questions.jsonl"


def test_a_bad_line_and_an_oversized_file_are_refused_before_anything_is_kept(stack):
    _, secret = key("client")
    client = stack.openai(secret, timeout=30)
    bad = jsonl(2) + b'{"custom_id": "q-3", "method": "POST", "url": "/v1/embeddings"}\n'

    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("bad.jsonl", bad), purpose="batch")
    assert "line 3: 'body' must be a JSON object" in err.value.message

    # The bound holds before Django reads a byte: from Content-Length, at the edge.
    conn = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=30)
    conn.putrequest("POST", "/v1/files")
    conn.putheader("Authorization", f"Bearer {secret}")
    conn.putheader("Content-Type", "multipart/form-data; boundary=x")
    conn.putheader("Content-Length", str(300 << 20))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413
    assert json.loads(resp.read())["error"]["code"] == "request_too_large"
    conn.close()
    assert list(client.files.list()) == []
