"""LoRA adapters in the routing table, without a database: which replicas take an
adapter's requests, what the engine is sent, and why none can when none can."""

import pytest

from fleet.gateway import table
from fleet.gateway.errors import GatewayError
from fleet.gateway.outgoing import changed_body

MODEL = table.ModelView(1, "qwen", 1700000000, 2)
SQL = table.AdapterView("qwen-sql", 1, 1700000100)


def shard(held=(), port=8000, state="ready"):
    return table.ShardView(0, state, "running", "n1", "10.0.0.7", port, "ready", "", held)


def replica(rid, *held, engine="llamacpp", max_adapters=2, port=8000, state="ready"):
    return table.ReplicaView(
        rid, 1, "ready", "", "qwen-served", (shard(held, port, state),), 1, "gpu", engine,
        max_adapters,
    )  # fmt: skip


def loaded(name, number=0):
    return {"name": name, "state": "loaded", "error": "", "id": number}


class Req:
    def __init__(self, model, **body):
        self.model = model
        self.body = {"model": model, "messages": [], **body}
        self.raw = b""
        self.endpoint = "chat/completions"


def test_an_adapter_goes_only_to_the_replicas_that_hold_it_and_shares_their_counters():
    routes = table.build_routes(
        [MODEL],
        [replica("a", loaded("qwen-sql", 1)), replica("b", port=8001)],
        adapters=[SQL],
    )
    route = routes["qwen-sql"]
    assert route.base == "qwen"
    assert [u.replica_id for u in route.upstreams] == ["a"]
    # one upstream object: a request for the adapter is load on the model's replica too
    assert route.upstreams[0] is routes["qwen"].upstreams[0]
    assert {u.replica_id for u in routes["qwen"].upstreams} == {"a", "b"}


@pytest.mark.parametrize(
    "engine, sent",
    [
        # llama.cpp's server: the base's name, and the adapter applied by its number
        # (without the prompt cache: ggml-org/llama.cpp#26207)
        (
            "llamacpp",
            {"model": "qwen-served", "lora": [{"id": 1, "scale": 1.0}], "cache_prompt": False},
        ),
        # vLLM serves a loaded adapter under its own name
        ("vllm", {"model": "qwen-sql"}),
        # SGLang: the base's name, the adapter in lora_path
        ("sglang", {"model": "qwen-served", "lora_path": "qwen-sql"}),
    ],
)
def test_the_engine_is_asked_for_the_adapter_its_own_way(engine, sent):
    routes = table.build_routes(
        [MODEL], [replica("a", loaded("qwen-sql", 1), engine=engine)], adapters=[SQL]
    )
    route = routes["qwen-sql"]
    body, _ = changed_body(route, Req("qwen-sql", temperature=0), route.upstreams[0])
    assert body == {"messages": [], "temperature": 0, **sent}


def test_an_adapter_unloaded_after_routing_is_asked_again_not_sent_to_the_base():
    routes = table.build_routes([MODEL], [replica("a", loaded("qwen-sql"))], adapters=[SQL])
    route, up = routes["qwen-sql"], routes["qwen-sql"].upstreams[0]
    up.adapters = {}
    with pytest.raises(GatewayError) as refused:
        changed_body(route, Req("qwen-sql"), up)
    assert refused.value.status == 503 and "unloaded" in refused.value.message


def test_one_no_replica_holds_yet_waits_while_a_replica_loads_it():
    route = table.build_routes([MODEL], [replica("a")], adapters=[SQL])["qwen-sql"]
    assert route.upstreams == [] and route.waits
    assert (
        route.unavailable
        == "adapter 'qwen-sql' of model 'qwen' is not loaded on a ready replica yet"
    )


def test_replicas_that_hold_no_adapters_say_so_and_nothing_waits():
    route = table.build_routes([MODEL], [replica("a", max_adapters=0)], adapters=[SQL])["qwen-sql"]
    assert not route.waits
    assert "max_adapters is 0" in route.unavailable


def test_an_adapter_that_failed_everywhere_is_refused_with_the_engines_reason():
    failed = {"name": "qwen-sql", "state": "failed", "error": "llama_adapter_lora_init: bad magic"}
    route = table.build_routes([MODEL], [replica("a", failed)], adapters=[SQL])["qwen-sql"]
    assert not route.waits
    assert route.unavailable == (
        "adapter 'qwen-sql' of model 'qwen' failed to load: llama_adapter_lora_init: bad magic"
    )


def test_while_the_base_restarts_an_adapters_request_waits_for_it():
    starting = table.ReplicaView(
        "a", 1, "ready", "", "qwen-served", (shard(state="starting"),), 1, "gpu", "llamacpp", 1
    )
    route = table.build_routes([MODEL], [starting], adapters=[SQL])["qwen-sql"]
    assert route.waits and route.upstreams == []
    assert route.unavailable.startswith("adapter 'qwen-sql' of model 'qwen' has no ready replica")


def test_a_request_for_the_model_itself_tells_llama_cpp_that_no_adapter_applies():
    # llama.cpp's server would apply its adapters at its own scales to a request naming
    # none, and keep a prompt cache made with them
    routes = table.build_routes(
        [MODEL], [replica("a", loaded("qwen-sql", 1), loaded("qwen-chat", 0))], adapters=[SQL]
    )
    body, _ = changed_body(routes["qwen"], Req("qwen"), routes["qwen"].upstreams[0])
    assert body["model"] == "qwen-served"
    assert body["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]
    assert body["cache_prompt"] is False  # ggml-org/llama.cpp#26207
    # other engines, and llama.cpp holding none, get the body as it was
    for view in (replica("b", loaded("qwen-sql"), engine="vllm"), replica("c")):
        up = table.build_routes([MODEL], [view])["qwen"].upstreams[0]
        assert "lora" not in (changed_body(routes["qwen"], Req("qwen"), up)[0] or {})


def test_an_adapter_of_a_model_kept_to_its_team_answers_only_that_teams_keys():
    from dataclasses import replace

    from fleet.gateway.keys import KeyEntry

    kept = replace(MODEL, kept_to=(7, "research"))
    routes = table.build_routes([kept], [replica("a", loaded("qwen-sql", 1))], adapters=[SQL])

    def key(team_id, allowed=()):
        return KeyEntry(1, "k", "lgk_x", "inference", frozenset(allowed), None, False,
                        team_id=team_id)  # fmt: skip

    assert routes["qwen-sql"].kept_to == (7, "research")
    assert key(7).may_call(routes["qwen-sql"]) and key(7).may_call(routes["qwen"])
    assert not key(8).may_call(routes["qwen-sql"]) and not key(None).may_call(routes["qwen"])
    # a key of the team is still bound by its own allowed models
    assert not key(7, allowed=["qwen"]).may_call(routes["qwen-sql"])
