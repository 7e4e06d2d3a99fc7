"""/v1/rerank and /v1/score on a real web process, in front of the project's fake engine
process (which answers them as vLLM does): routed as any request, passed through to
engines that serve them, their tokens counted; refused clearly where the replica's
engine does not serve them."""

import json
import urllib.request

import openai
import pytest

from fleet.models import EngineProfile
from tests.factories import inference_key, ready_model
from tests.gateway.live import post
from tests.processes import FakeEngine

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

DOCS = ["the cat sat on the mat", "a fleet of engines", "engines serve the fleet"]


@pytest.fixture
def engine(tmp_path):
    e = FakeEngine(tmp_path, "tiny-served")
    yield e
    e.kill()


def prompt_tokens(server, model: str) -> float:
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    line = f'llmgw_gateway_tokens_total{{kind="prompt",model="{model}"}} '
    found = [x for x in text.splitlines() if x.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_rerank_and_score_pass_through_and_are_counted(gateway_server, engine):
    # given a model on an engine that serves both, under another name
    ready_model("ranker", [engine], served_name="tiny-served")
    _, secret = inference_key()
    # the openai client has no rerank method: its generic POST, as users call other APIs
    c = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key=secret, max_retries=0)

    # when a client reranks documents for a query, keeping the best two
    ranked = c.post(
        "/rerank",
        body={"model": "ranker", "query": "fleet engines", "documents": DOCS, "top_n": 2},
        cast_to=object,
    )
    # and scores pairs
    scored = c.post(
        "/score",
        body={"model": "ranker", "text_1": "fleet engines", "text_2": DOCS},
        cast_to=object,
    )

    # then the engine's answers come back as vLLM writes them
    assert [(r["index"], r["relevance_score"]) for r in ranked["results"]] == [(1, 1.0), (2, 1.0)]
    assert ranked["results"][0]["document"] == {"text": DOCS[1], "multi_modal": None}
    assert [d["score"] for d in scored["data"]] == [0.0, 1.0, 1.0]
    assert scored["object"] == "list" and scored["model"] == "tiny-served"
    # and their tokens were counted: a word a token for each pair, as the engine said
    assert ranked["usage"]["prompt_tokens"] == scored["usage"]["prompt_tokens"] == 20
    assert prompt_tokens(gateway_server, "ranker") == 40.0


def test_an_engine_that_does_not_rerank_is_named_in_a_clear_400(gateway_server, upstreams):
    # given a model on llama.cpp, whose pinned server serves no rerank or score
    up = upstreams("a")
    _, (replica,) = ready_model("chatty", [up])
    EngineProfile.objects.filter(pk=replica.profile_id).update(engine="llamacpp")
    _, secret = inference_key()

    for path in ("/v1/rerank", "/v1/score"):
        body = {"model": "chatty", "query": "q", "documents": ["d"], "text_1": "q", "text_2": "d"}
        status, _, raw = post(gateway_server, path, body, secret)
        # then the client is told which engine cannot, and which can
        assert status == 400, raw
        error = json.loads(raw)["error"]
        assert error["code"] == "unsupported_endpoint" and error["param"] == "model"
        assert f"model 'chatty' cannot be served {path}" in error["message"]
        assert "llama.cpp" in error["message"] and "vLLM" in error["message"]
    # and the engine was never asked
    assert up.requests == []


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/rerank", {"model": "ranker", "documents": ["d"]}, "query"),
        ("/v1/rerank", {"model": "ranker", "query": "q"}, "documents"),
        ("/v1/score", {"model": "ranker", "text_1": "q"}, "text_2"),
    ],
)
def test_a_request_missing_a_side_is_a_400_naming_it(gateway_server, engine, path, body, param):
    ready_model("ranker", [engine], served_name="tiny-served")
    _, secret = inference_key()
    status, _, raw = post(gateway_server, path, body, secret)
    assert status == 400
    assert json.loads(raw)["error"]["param"] == param
