"""/v1/messages and /v1/responses against the real llama.cpp engine (llama-cpp-python's
server, which serves neither: the gateway translates to and from its chat completions),
through the official anthropic and openai clients, unmodified.

One engine process for the module, on the generated tiny model: each test routes to it
from a gateway of its own. Greedy decoding (temperature 0) makes the engine's answer to
the same prompt the same, so each API's text is checked against the chat completion's.
"""

import subprocess
import time
import urllib.request
from types import SimpleNamespace

import anthropic
import openai
import pytest

from fleet.models import EngineProfile
from tests.factories import inference_key, ready_model
from tests.processes import free_port

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

PROMPT = "Tell me a story"
MAX = 8


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """llama.cpp serving the tiny model, as the agent starts it; its port."""
    from agentd.engines.llamacpp import LlamaCpp
    from agentd.tinygguf import write as write_tiny_model
    from tests.engines.helpers import profile, shard

    tmp = tmp_path_factory.mktemp("llama")
    gguf = write_tiny_model(tmp / "tiny.gguf")
    engine, port = LlamaCpp(), free_port()
    prof = profile("llamacpp", model_path=str(gguf), served_model_name="tiny-llama")
    args = engine.command() + engine.args(prof, shard(profile=prof), "127.0.0.1", port)
    with open(tmp / "llama.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{engine.health_path}")
                break
            except OSError:
                assert proc.poll() is None, (tmp / "llama.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "llama.cpp did not come up"
                time.sleep(0.2)
        yield port
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def served(live_web, llama):
    """The model "tiny" on that engine, its profile's engine llama.cpp; a key for it."""
    _, (replica,) = ready_model("tiny", [SimpleNamespace(port=llama)], served_name="tiny-llama")
    EngineProfile.objects.filter(pk=replica.profile_id).update(engine="llamacpp")
    _, secret = inference_key()
    chat = openai.OpenAI(base_url=live_web.url + "/v1", api_key=secret, max_retries=0)
    # the engine's own answer to the prompt, as a chat completion
    expected = chat.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=MAX,
        temperature=0,
    )
    return SimpleNamespace(url=live_web.url, secret=secret, openai=chat, expected=expected)


def completion_tokens(url: str) -> float:
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    line = 'llmgw_gateway_tokens_total{kind="completion",model="tiny"} '
    return float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])


def test_messages_from_llama_cpp_whole_and_streamed(served):
    c = anthropic.Anthropic(base_url=served.url, api_key=served.secret, max_retries=0)
    ask = {
        "model": "tiny",
        "max_tokens": MAX,
        "messages": [{"role": "user", "content": PROMPT}],
        # the client no longer names it; the API and the gateway still take it
        "extra_body": {"temperature": 0},
    }
    chat = served.expected

    # whole: the engine's text, stop reason and usage, in Anthropic's message
    message = c.messages.create(**ask)
    assert message.content[0].text == chat.choices[0].message.content
    assert (
        message.stop_reason
        == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    )
    assert message.usage.input_tokens == chat.usage.prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens

    # streamed: the SDK's helper yields Anthropic's events, and the same text
    before = completion_tokens(served.url)
    with c.messages.stream(**ask) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    kinds = [e for e in events if e != "text"]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert final.content[0].text == chat.choices[0].message.content
    assert final.stop_reason == message.stop_reason
    # llama-cpp-python's server reports no usage in a stream: the pieces streamed are
    # the output tokens, told to the client and counted by the gateway alike
    assert final.usage.output_tokens == len(kinds[2:-3]) >= 1
    assert completion_tokens(served.url) - before == final.usage.output_tokens


def test_responses_from_llama_cpp_whole_and_streamed(served):
    o = served.openai
    chat = served.expected
    ask = {"model": "tiny", "input": PROMPT, "max_output_tokens": MAX, "temperature": 0}
    status = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"

    whole = o.responses.create(**ask)
    assert whole.output_text == chat.choices[0].message.content
    assert whole.status == status
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.usage.output_tokens == chat.usage.completion_tokens

    with o.responses.stream(**ask) as s:
        events = list(s)
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-1] == f"response.{status}"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == chat.choices[0].message.content
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == len(deltas)
