"""A model that cannot answer is answered by its fallback, through the real stack: a web
process, an agent and llama.cpp on the tiny model (docs/gateway.md, "Fallbacks")."""

import pytest

from tests.e2e.helpers import apply_model, wait_serving

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_model_scaled_to_nothing_is_answered_by_its_fallback(stack, tiny_model):
    # given: tiny-llama serving, and big (no replica) falling back to it
    stack.add_agent("cpu-a")
    apply_model(stack, tiny_model)
    wait_serving(stack)
    apply_model(stack, tiny_model, name="big", replicas=0, fallbacks=["tiny-llama"])

    client = stack.openai(timeout=30)
    stack.wait(lambda: "big" in [m.id for m in client.models.list()], "the gateway to know big")

    # when: a client asks big, plainly and streamed
    ask = {"model": "big", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    whole = client.chat.completions.with_raw_response.create(**ask)
    stream = client.chat.completions.with_raw_response.create(**ask, stream=True)

    # then: llama.cpp serving tiny-llama answers both, and says it is the fallback
    assert whole.headers["x-llmgw-fallback"] == "tiny-llama"
    assert whole.parse().choices[0].finish_reason in ("length", "stop")
    assert stream.headers["x-llmgw-fallback"] == "tiny-llama"
    chunks = list(stream.parse())
    assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop")
