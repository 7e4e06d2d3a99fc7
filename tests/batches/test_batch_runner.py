"""The runner over a stand-in gateway: every line answered once, what a dead worker left
kept, lines that must wait sent again, pauses for interactive traffic, cancel and expiry."""

import json
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Batch, BatchFile, BatchLine
from fleet.services.batches import files, leases, lifecycle, pause, runner
from fleet.services.batches.jsonl import check
from tests.batches.helpers import StubGateway, jsonl, key

pytestmark = pytest.mark.django_db

READY = pause.Facts(ready=frozenset({"tiny"}))


@pytest.fixture
def facts(monkeypatch):
    """What the runner sees of interactive traffic; the model ready unless a test says."""
    seen = {"now": READY}
    monkeypatch.setattr(pause, "gather", lambda: seen["now"])
    return seen


@pytest.fixture
def gateway(settings):
    stub = StubGateway()
    settings.LLMGW = {
        **settings.LLMGW,
        "BATCH_GATEWAY_URL": stub.url + "/v1",
        "BATCH_RETRY_S": 0.05,
        "BATCH_SLICE_S": 5.0,
    }
    yield stub
    stub.close()


def new_batch(lines: int = 20, key_row=None) -> Batch:
    from django.core.files.base import ContentFile

    if key_row is None:
        key_row, _ = key("client")
    content = jsonl(lines)
    checked = check(
        content.splitlines(keepends=True),
        max_lines=1000,
        max_body_bytes={"chat/completions": 1 << 20, "completions": 1, "embeddings": 1},
        check_body=lambda endpoint, raw: None,
    )
    upload = ContentFile(content, name="in.jsonl")
    source = files.store_input(key_row, upload, "in.jsonl", checked)
    batch = lifecycle.create(
        key_row,
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    return Batch.objects.get(pk=batch.pk)


def start(batch: Batch) -> None:
    Batch.objects.filter(pk=batch.pk).update(status="in_progress")


def owner(batch: Batch) -> str:
    return leases.owner_of(batch.team_id, batch.api_key_id)


def run_until_finished(batch: Batch, tries: int = 50) -> Batch:
    for _ in range(tries):
        runner.run_owner(owner(batch))
        batch.refresh_from_db()
        if batch.status in ("completed", "expired", "cancelled", "failed"):
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch.pk} still {batch.status}: {batch.answered} answered")


def read(file_id: str) -> list[dict]:
    with files.open_file(BatchFile.objects.get(pk=file_id)) as fh:
        return [json.loads(line) for line in fh.read().splitlines()]


def test_every_line_is_sent_as_the_batchs_key_and_answered_once(gateway, facts):
    batch = new_batch(20)
    start(batch)

    batch = run_until_finished(batch)

    assert batch.status == "completed" and batch.completed_at
    assert (batch.total, batch.completed, batch.failed) == (20, 20, 0)
    out = read(batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"q-{i}" for i in range(1, 21))
    first = next(line for line in out if line["custom_id"] == "q-7")
    assert first["response"]["status_code"] == 200
    assert first["response"]["body"]["choices"][0]["message"]["content"] == "re q7"
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert batch.error_file_id is None
    assert set(gateway.asked.values()) == {1} and len(gateway.asked) == 20
    assert gateway.digests == {batch.api_key.secret_hash}
    # The rows were there to write each answer once; the file holds them now.
    assert not BatchLine.objects.filter(batch=batch).exists()


def test_what_a_dead_worker_wrote_is_kept_and_not_sent_again(gateway, facts):
    batch = new_batch(20)
    start(batch)
    # given: a worker answered lines 1-7 and died before the rest
    BatchLine.objects.bulk_create(
        BatchLine(
            batch=batch,
            line=n,
            custom_id=f"q-{n}",
            status_code=200,
            body=json.dumps({"first": n}),
        )
        for n in range(1, 8)
    )

    batch = run_until_finished(batch)

    assert sorted(gateway.asked) == sorted(f"q{i}" for i in range(8, 21))
    out = {line["custom_id"]: line for line in read(batch.output_file_id)}
    assert len(out) == 20
    assert out["q-3"]["response"]["body"] == {"first": 3}
    assert (batch.completed, batch.failed) == (20, 0)


def test_a_line_written_by_two_workers_keeps_its_first_answer_and_counts_once(gateway):
    batch = new_batch(5)
    start(batch)
    # given: two workers for a moment (one whose lease ran out writes what it had in flight)
    late, current = (runner.Slice(owner(batch), threading.Event()) for _ in range(2))

    def answer(n: int, status: int, who: str) -> BatchLine:
        body = json.dumps({"by": who})
        return BatchLine(
            batch_id=batch.pk, line=n, custom_id=f"q-{n}", status_code=status, body=body
        )

    # when: each writes its answers, line 2 by both
    late._write(batch.pk, [answer(1, 200, "late"), answer(2, 400, "late")])
    current._write(batch.pk, [answer(2, 200, "current"), answer(3, 200, "current")])

    # then: three lines, each counted once, line 2 with the first answer written
    batch.refresh_from_db()
    assert (batch.completed, batch.failed) == (2, 1)
    rows = dict(BatchLine.objects.filter(batch=batch).values_list("line", "body"))
    assert sorted(rows) == [1, 2, 3] and json.loads(rows[2]) == {"by": "late"}


def test_a_line_refused_for_now_goes_again_and_a_client_error_is_its_answer(settings, facts):
    def script(question, nth):
        if question == "q3" and nth == 1:
            return (
                429,
                {"error": {"code": "rate_limit_exceeded", "message": "x"}},
                {"Retry-After": "0"},
            )
        if question == "q5" and nth < 3:
            return 503, {"error": {"code": "no_ready_replica", "message": "x"}}, {}
        if question == "q2":
            return 400, {"error": {"code": None, "message": "'messages' is odd"}}, {}
        return None

    stub = StubGateway(script)
    settings.LLMGW = {
        **settings.LLMGW,
        "BATCH_GATEWAY_URL": stub.url,
        "BATCH_RETRY_S": 0.05,
    }
    try:
        batch = new_batch(6)
        start(batch)
        batch = run_until_finished(batch)
    finally:
        stub.close()

    assert (batch.completed, batch.failed) == (5, 1)
    assert (stub.asked["q3"], stub.asked["q5"], stub.asked["q1"]) == (2, 3, 1)
    (bad,) = read(batch.error_file_id)
    assert bad["custom_id"] == "q-2"
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["message"] == "'messages' is odd"
    assert len(read(batch.output_file_id)) == 5


def test_no_line_starts_while_interactive_requests_wait_or_no_replica_is_ready(gateway, facts):
    batch = new_batch(3)
    start(batch)

    facts["now"] = pause.Facts(ready=frozenset())
    runner.run_owner(owner(batch))
    batch.refresh_from_db()
    assert (batch.paused, gateway.asked) == ("model 'tiny' has no ready replica", {})

    facts["now"] = pause.Facts(ready=frozenset({"tiny"}), waiting={"tiny": 2})
    runner.run_owner(owner(batch))
    batch.refresh_from_db()
    assert batch.paused == "2 interactive request(s) wait for model 'tiny'"
    assert gateway.asked == {}

    facts["now"] = READY
    batch = run_until_finished(batch)
    assert batch.status == "completed" and batch.paused == ""
    assert len(gateway.asked) == 3


def answered_before(batch: Batch, lines: range) -> None:
    BatchLine.objects.bulk_create(
        BatchLine(batch=batch, line=n, custom_id=f"q-{n}", status_code=200, body="{}")
        for n in lines
    )


def test_a_cancelled_batch_ends_with_what_was_answered(gateway, facts):
    batch = new_batch(20)
    start(batch)
    answered_before(batch, range(1, 6))
    lifecycle.cancel(batch)

    batch = run_until_finished(batch)

    assert batch.status == "cancelled" and batch.cancelled_at
    assert gateway.asked == {}
    assert [line["custom_id"] for line in read(batch.output_file_id)] == [
        f"q-{n}" for n in range(1, 6)
    ]
    assert (batch.completed, batch.failed, batch.total) == (5, 0, 20)


def test_a_batch_past_its_window_expires_and_says_which_lines_were_not_run(gateway, facts):
    batch = new_batch(8)
    start(batch)
    answered_before(batch, range(1, 4))
    Batch.objects.filter(pk=batch.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    batch = run_until_finished(batch)

    assert batch.status == "expired" and batch.expired_at and batch.finalizing_at
    assert gateway.asked == {}
    assert len(read(batch.output_file_id)) == 3
    late = read(batch.error_file_id)
    assert [line["custom_id"] for line in late] == [f"q-{n}" for n in range(4, 9)]
    assert {line["error"]["code"] for line in late} == {"batch_expired"}
    assert (batch.completed, batch.failed) == (3, 5)


def test_one_worker_at_a_time_sends_an_owners_lines(gateway, facts):
    batch = new_batch(3)
    start(batch)
    held = leases.Lease(owner(batch), 5)
    with held as got:
        assert got
        assert runner.tick() == []  # beat hands it to no other worker
        assert runner.run_owner(owner(batch)) is False
        assert gateway.asked == {}
    assert runner.tick() == [owner(batch)]


def test_finishing_twice_writes_one_output(gateway, facts):
    batch = new_batch(2)
    start(batch)
    answered_before(batch, range(1, 3))
    # a finish that died after writing the output file, before its status moved
    first = files.write_output(batch, "output", [b'{"a": 1}\n'])
    assert lifecycle.finish(batch, "completed")
    batch.refresh_from_db()
    assert batch.output_file_id == first.pk
    assert BatchFile.objects.filter(purpose="batch_output").count() == 1
    assert lifecycle.finish(batch, "completed") is False


def test_a_worker_that_lost_its_lease_starts_no_line(gateway, facts):
    import threading

    batch = new_batch(3)
    start(batch)
    lost = threading.Event()
    lost.set()  # Redis would not renew it: another worker may hold the batch now

    more = runner.Slice(owner(batch), lost).run(5)

    assert more is False and gateway.asked == {}
    assert not BatchLine.objects.filter(batch=batch).exists()
