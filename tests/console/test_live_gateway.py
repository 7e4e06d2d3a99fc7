"""The model page's gateway figures without Prometheus: a real gateway on Daphne records
its counters per model in the history, and the page reads them."""

import time

import openai
import pytest
from django.test import Client
from django.urls import reverse

from fleet.services import history
from tests.factories import inference_key, operator, ready_model
from tests.processes import FakeEngine, start_web

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def wait_for_point(model: str, requests_at_least: int, deadline_s: float = 20) -> list:
    """The gateway's points once one counts this many requests (a wait, not a measure)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        points = history._gateway_points(model, 0)
        if any(p[3] >= requests_at_least for p in points):
            return points
        time.sleep(0.1)
    raise AssertionError(f"no point counting {requests_at_least} requests: {points}")


def test_the_model_page_reads_what_the_gateway_recorded(tmp_path):
    engine = FakeEngine(tmp_path, "tiny")
    model, _ = ready_model("tiny", [engine])
    _, secret = inference_key()
    server = start_web(tmp_path, LLMGW_HISTORY_STEP_S="0.2")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=secret)
        ask = lambda: client.completions.create(model="tiny", prompt="x", max_tokens=2)  # noqa: E731
        ask()  # the gateway starts with its first request, and its recorder with it
        wait_for_point("tiny", 1)
        for _ in range(3):
            ask()
        points = wait_for_point("tiny", 4)
    finally:
        server.stop()
        engine.kill()

    # Each point names the process that counted: one Daphne here.
    assert len({p[1] for p in points}) == 1
    operator_client = Client()
    operator_client.force_login(operator())
    html = operator_client.get(reverse("console:model", args=[model.pk])).content.decode()
    rps = html.split('id="model-rps">')[1].split("<")[0]
    latency = html.split('id="model-latency">')[1].split("<")[0]
    assert float(rps) > 0, rps
    assert latency.endswith(" s"), latency
