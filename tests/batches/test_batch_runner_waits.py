"""A batch whose line the gateway turned away for now (the gateway away, the model busy)
starts no other line until the wait is over, and its worker waits for beat's next tick
instead of starting the whole input again at once."""

import threading

import pytest

from fleet.services.batches import pause, runner
from tests.batches.helpers import StubGateway
from tests.batches.test_batch_runner import new_batch, owner, start
from tests.processes import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def ready(monkeypatch):
    monkeypatch.setattr(pause, "gather", lambda: pause.Facts(ready=frozenset({"tiny"})))


@pytest.fixture
def busy(settings):
    """A gateway that answers every line 429 model_at_capacity, Retry-After 30 s."""
    refused = (429, {"error": {"code": "model_at_capacity", "message": "busy"}})
    stub = StubGateway(lambda question, nth: (*refused, {"Retry-After": "30"}))
    settings.LLMGW = {
        **settings.LLMGW,
        "BATCH_GATEWAY_URL": stub.url,
        "BATCH_CONCURRENCY": 4,
        "BATCH_SLICE_S": 5.0,
    }
    yield stub
    stub.close()


def test_a_line_turned_away_holds_its_batch_and_the_worker_waits_for_beat(busy):
    batch = new_batch(40)
    start(batch)

    # when: a slice sends the first lines and the gateway turns them away for 30 s
    again_at_once = runner.run_owner(owner(batch))

    # then: no line started after the first answer said "not now", none was answered,
    # and the worker does not start the input over at once (beat's tick brings it back)
    assert sum(busy.asked.values()) <= 4, busy.asked
    assert again_at_once is False
    batch.refresh_from_db()
    assert (batch.completed, batch.failed, batch.status) == (0, 0, "in_progress")


def test_a_gateway_that_is_away_is_not_sent_the_whole_input(settings):
    # given: nothing listens where the gateway should be
    settings.LLMGW = {
        **settings.LLMGW,
        "BATCH_GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
        "BATCH_RETRY_S": 30.0,
        "BATCH_SLICE_S": 5.0,
    }
    batch = new_batch(40)
    start(batch)

    # when: a slice runs
    slice_ = runner.Slice(owner(batch), threading.Event())
    again_at_once = slice_.run(5)

    # then: it tried no more lines than it may have in flight, and hands back to beat
    (running,) = slice_.batches.values()
    assert len(running.again) <= 4
    assert again_at_once is False
