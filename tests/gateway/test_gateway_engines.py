"""The gateway in front of the project's fake engine process, in the web process
(uvicorn through llmgw_site.serve) and gateway-only on uvicorn."""

import socket
import subprocess
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import openai
import pytest

from tests.factories import inference_key, ready_model
from tests.processes import (
    FakeEngine,
    free_port,
    start_uvicorn,
)

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def engines(tmp_path):
    made = []

    def make(*extra):
        made.append(FakeEngine(tmp_path, "tiny", *extra))
        return made[-1]

    yield make
    for e in made:
        if e.proc.poll() is None:
            e.kill()


def use_every_endpoint(c: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    chat = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=3)
    assert chat.choices[0].message.content.split() == ["the", "quick", "brown"]
    stream = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in stream).split() == [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
    ]
    assert c.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].text
    assert len(c.embeddings.create(model="tiny", input=["a", "b"]).data) == 2
    assert [m.id for m in c.models.list().data] == ["tiny"]


def test_the_gateway_only_entry_point_on_uvicorn(transactional_db, tmp_path, engines):
    ready_model("tiny", [engines()])
    _, secret = inference_key()
    server = start_uvicorn(tmp_path)
    try:
        use_every_endpoint(openai.OpenAI(base_url=server.url + "/v1", api_key=secret))
        metrics = urllib.request.urlopen(server.url + "/metrics").read().decode()
        assert 'llmgw_gateway_requests_total{adapter="",model="tiny",status="200"} 4.0' in metrics
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url + "/admin/")
        assert err.value.code == 404
        assert b"this process serves only /v1/* and /metrics" in err.value.read()
    finally:
        server.stop()


def test_the_gateway_with_the_fake_engine(live_web, engines):
    ready_model("tiny", [engines()])
    _, secret = inference_key()
    use_every_endpoint(openai.OpenAI(base_url=live_web.url + "/v1", api_key=secret))


def test_a_killed_engine_costs_no_request_that_had_not_started(live_web, engines):
    # given two ready replicas, both in use
    a, b = engines(), engines()
    _, (ra, rb) = ready_model("tiny", [a, b])
    _, secret = inference_key()
    c = openai.OpenAI(base_url=live_web.url + "/v1", api_key=secret, max_retries=0)

    def ask():
        return c.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )

    # idle replicas tie and the tie is drawn at random: 8 asks all went to one
    # replica once in CI (1 in 128); 64 make that 1 in 2**63
    served = set()
    for _ in range(64):
        served.add(ask().headers["x-llmgw-replica"])
        if len(served) == 2:
            break
    assert served == {ra.pk, rb.pk}

    # when one engine is killed while the table still calls it ready
    a.kill()

    # then every later request is answered by the other; a is set aside once its
    # connects have failed twice (30 requests make that all but certain)
    for _ in range(30):
        resp = ask()
        assert resp.status_code == 200 and resp.headers["x-llmgw-replica"] == rb.pk
    metrics = urllib.request.urlopen(live_web.url + "/metrics").read().decode()
    assert 'llmgw_gateway_cooldowns_total{model="tiny",replica="' + ra.pk in metrics


def test_a_client_that_hangs_up_cancels_the_engines_request(live_web, engines):
    # given an engine that takes its time over each token
    engine = engines("--token-delay", "0.3")
    ready_model("tiny", [engine])
    _, secret = inference_key()
    body = (
        b'{"model": "tiny", "stream": true, "max_tokens": 50, '
        b'"messages": [{"role": "user", "content": "x"}]}'
    )
    with socket.create_connection(("127.0.0.1", live_web.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {secret}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        # when the client hangs up after the first bytes
    # then the engine stops generating for it, and nothing stays in flight
    deadline = time.monotonic() + 10
    while True:
        m = engine.metrics()
        if m["fake:requests_cancelled_total"] == 1 and m["fake:requests_running"] == 0:
            break
        assert time.monotonic() < deadline, f"the engine's request was never cancelled: {m}"
        time.sleep(0.1)


def test_the_real_llama_cpp_engine_through_the_gateway(live_web, tmp_path):
    from agentd.engines.llamacpp import LlamaCpp
    from agentd.tinygguf import write as write_tiny_model
    from tests.engines.helpers import profile, shard

    # given the generated tiny model served by llama.cpp, as the agent would start it
    gguf = write_tiny_model(tmp_path / "tiny.gguf")
    engine = LlamaCpp()
    port = free_port()
    prof = profile("llamacpp", model_path=str(gguf), served_model_name="tiny-llama")
    args = engine.command() + engine.args(prof, shard(profile=prof), "127.0.0.1", port)
    with open(tmp_path / "llama.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{engine.health_path}")
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "llama.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "llama.cpp did not come up"
                time.sleep(0.2)

        ready_model("tiny", [SimpleNamespace(port=port)], served_name="tiny-llama")
        _, secret = inference_key()
        c = openai.OpenAI(base_url=live_web.url + "/v1", api_key=secret, max_retries=0)

        # when the unmodified openai client asks through the gateway
        msgs = [{"role": "user", "content": "hello"}]
        chat = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8)
        stream = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, stream=True)
        chunks = list(stream)
        completion = c.completions.create(model="tiny", prompt="the", max_tokens=4)

        # then the engine's answers come back whole: its text is noise, its shape is real
        assert chat.object == "chat.completion" and chat.usage.completion_tokens >= 1
        assert isinstance(chat.choices[0].message.content, str)
        assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop")
        assert completion.choices[0].text is not None

        # and the gateway counts the tokens: the engine's usage, and a token for each
        # streamed event that carried text, as the client saw them
        streamed = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
        expected = chat.usage.completion_tokens + streamed + completion.usage.completion_tokens
        metrics = urllib.request.urlopen(live_web.url + "/metrics").read().decode()
        line = f'llmgw_gateway_tokens_total{{kind="completion",model="tiny"}} {expected:.1f}'
        assert line in metrics, [m for m in metrics.splitlines() if "tokens_total" in m]
    finally:
        proc.kill()
        proc.wait(10)
