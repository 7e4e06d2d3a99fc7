"""The gateway's pure parts, without a database: the routing rules, picking, SSE checks, parsing."""

import collections

import pytest

from fleet.gateway import choice, table, validate
from fleet.gateway.answers import SSECheck, usage_of
from fleet.gateway.engines import parse_waiting
from fleet.gateway.errors import GatewayError


def shard(state="ready", desired="running", rank=0, addr="10.0.0.7", port=8000, node="n1", **kw):
    return table.ShardView(
        rank, state, desired, node, addr, port, kw.get("node_state", "ready"), kw.get("error", "")
    )


def replica(rid, *shards, state="ready", reason="", model_id=1, served="m"):
    return table.ReplicaView(rid, model_id, state, reason, served, tuple(shards))


MODEL = table.ModelView(1, "m", 1700000000, 2)


@pytest.mark.parametrize(
    "view, expected",
    [
        (replica("r", shard()), ("ready", "")),
        (replica("r", shard(), shard(rank=1, node="n2")), ("ready", "")),
        (replica("r", shard(), shard(rank=1, state="loading")), ("loading", "")),
        (replica("r", shard(state="loading")), ("loading", "")),
        (replica("r", shard(state="starting")), ("starting", "")),
        (replica("r", shard(desired="draining")), ("draining", "")),
        (replica("r", shard(state="draining")), ("draining", "")),
        (replica("r", shard(desired="stopped")), ("stopping", "")),
        (replica("r", shard(state="stopped")), ("stopping", "")),
        # placed again on n2: the old shard on a silent n1, told to stop, is not part of it
        (
            replica("r", shard(desired="stopped", node="n1"), shard(node="n2", addr="10.0.0.8")),
            ("ready", ""),
        ),
        (
            replica("r", shard(desired="stopped"), shard(node="n2", state="loading")),
            ("loading", ""),
        ),
        (replica("r", state="pending", reason="gpu-07: has 8 GB"), ("pending", "gpu-07: has 8 GB")),
        (replica("r", shard(state="failed", error="exit 1\ntrace")), ("failed", "exit 1")),
        (replica("r", shard(port=None)), ("unreachable", "its rank-0 shard has no address")),
        (replica("r", shard(addr="")), ("unreachable", "its rank-0 shard has no address")),
        (replica("r", shard(node_state="lost")), ("unreachable", "node n1 is lost")),
        (replica("r", shard(state="quantum")), ("failed", "unknown shard state ['quantum']")),
    ],
)
def test_only_replicas_whose_every_shard_is_ready_and_running_take_traffic(view, expected):
    assert table.replica_status(view) == expected


def test_the_unavailable_reason_counts_what_is_coming_first():
    routes = table.build_routes(
        [MODEL],
        [
            replica("a", state="pending", reason="gpu-07: has 8 GB of memory, needs 24"),
            replica("b", shard(state="loading")),
            replica("c", shard(state="loading")),
            replica("d", shard(desired="draining")),
        ],
    )
    route = routes["m"]
    assert route.upstreams == []
    assert route.unavailable == (
        "model 'm' has no ready replica: 2 loading; 1 pending: gpu-07: has 8 GB of memory, "
        "needs 24; 1 draining"
    )
    assert route.retry_after == 5
    scaled = table.build_routes([table.ModelView(2, "z", 0, 0)], [])["z"]
    assert scaled.unavailable == "model 'z' has no ready replica: it is scaled to 0 replicas"


def test_a_refresh_keeps_counters_of_replicas_that_stay():
    first = table.build_routes([MODEL], [replica("a", shard()), replica("b", shard(port=8001))])
    a = next(u for u in first["m"].upstreams if u.replica_id == "a")
    a.outstanding = 3
    second = table.build_routes([MODEL], [replica("a", shard())], first)
    assert second["m"].upstreams == [a] and a.outstanding == 3
    assert a.url == "http://10.0.0.7:8000"
    v6 = table.build_routes([MODEL], [replica("a", shard(addr="fd00::7"))])
    assert v6["m"].upstreams[0].url == "http://[fd00::7]:8000"


def test_pick_prefers_fewest_outstanding_and_breaks_ties_at_random():
    route = table.build_routes(
        [MODEL], [replica(r, shard(port=8000 + i)) for i, r in enumerate("abc")]
    )["m"]
    a, b, c = route.upstreams
    a.outstanding, b.outstanding, c.outstanding = 2, 1, 1
    picks = collections.Counter(choice.pick(route).replica_id for _ in range(2000))
    assert set(picks) == {"b", "c"}
    assert 800 < picks["b"] < 1200  # a fair coin, not round-robin order
    assert choice.pick(route, exclude=[b, c]) is a
    c.cooldown_until = float("inf")
    assert choice.pick(route, exclude=[b]) is a
    assert choice.pick(route, exclude=[a, b]) is None


def test_a_replica_on_a_suspect_node_is_picked_only_as_a_last_resort():
    # given: a on a node gone silent (suspect), b on a ready one, c with a shard on each
    route = table.build_routes(
        [MODEL],
        [
            replica("a", shard(node="n1", node_state="suspect")),
            replica("b", shard(node="n2", port=8001)),
            replica(
                "c", shard(node="n3", port=8002), shard(rank=1, node="n1", node_state="suspect")
            ),
        ],
    )["m"]
    a, b, c = route.upstreams
    # then: a replica with any shard on the suspect node is marked, the others not
    assert a.suspect and not b.suspect and c.suspect
    b.outstanding = 5
    # then: b takes the request though it has more outstanding; a and c only when
    # b cannot, the less busy of them first
    assert {choice.pick(route).replica_id for _ in range(50)} == {"b"}
    c.outstanding = 1
    assert choice.pick(route, exclude=[b]) is a
    b.cooldown_until = float("inf")
    assert choice.pick(route) is a
    # when: the node is heard from again, a refresh makes a a full member again
    again = table.build_routes(
        [MODEL],
        [replica("a", shard(node="n1")), replica("b", shard(node="n2", port=8001))],
        {"m": route},
    )["m"]
    assert again.upstreams[0] is a and not a.suspect


def test_sse_check_passes_whole_lines_and_notices_garbage_and_the_end():
    check = SSECheck()
    assert check.feed(b'data: {"a": 1}\n\ndata: {"b"') == (b'data: {"a": 1}\n\n', None)
    assert check.feed(b": 2}\n\n") == (b'data: {"b": 2}\n\n', None)
    assert not check.done
    assert check.feed(b"event: x\r\nid: 1\r\n\r\ndata: [DONE]\n\n")[1] is None
    assert check.done and check.tail == b""
    bad = SSECheck()
    good, problem = bad.feed(b"data: 1\n\n<html>502</html>\ndata: 2\n\n")
    assert good == b"data: 1\n\n"
    assert problem == "a line that is not server-sent events: b'<html>502</html>'"


def test_a_stream_counts_its_tokens_from_usage_or_else_from_the_events_with_text():
    # An engine without usage: the role event and the finish event carry no text.
    plain = SSECheck()
    plain.feed(
        b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n'
        b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
        b'data: {"choices": [{"delta": {"content": "lo"}}]}\n\n'
        b'data: {"choices": [{"delta": {}, "finish_reason": "length"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    assert (plain.events, plain.usage) == (2, None)
    # One that reports usage in its last event (OpenAI's stream_options.include_usage).
    told = SSECheck()
    told.feed(b'data: {"choices": [{"text": "a"}]}\n\n')
    told.feed(b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}\n\n')
    assert told.usage == {"prompt_tokens": 3, "completion_tokens": 9}


@pytest.mark.parametrize(
    "body, usage",
    [
        (b'{"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}', 5),
        (b'{"choices": [{"text": "no usage here"}]}', None),
        (b'{"usage": "not an object"}', None),
        (b'{"usage": {"completion_tokens": 5', None),  # cut off: nothing counted
    ],
)
def test_a_whole_answer_s_usage_is_read_from_its_end(body, usage):
    found = usage_of(body)
    assert (found or {}).get("completion_tokens") == usage


@pytest.mark.parametrize(
    "endpoint, body, message",
    [
        ("chat/completions", b'{"model": "\xc3"}', "not UTF-8 encoded JSON"),
        ("chat/completions", b'"hi"', "must be a JSON object, not a string"),
        ("chat/completions", b'{"model": "m", "messages": []}', "'messages' must not be empty"),
        ("chat/completions", b'{"model": "m", "messages": [1]}', "'messages[0]' must be an"),
        ("completions", b'{"model": "m", "prompt": 5}', "'prompt' must be a string or an array"),
        ("completions", b'{"model": "m", "prompt": "x", "n": 0}', "'n' must be at least 1"),
        ("completions", b'{"model": "m", "prompt": "x", "max_tokens": true}', "an integer, not a"),
        ("completions", b'{"model": "m", "prompt": "x", "temperature": "hot"}', "a number"),
        ("embeddings", b'{"model": "", "input": "x"}', "'model' is required"),
        # an engine's scheduling priority (vLLM's and SGLang's extra field) would let
        # one client's requests go ahead of another team's on a shared replica
        ("completions", b'{"model": "m", "prompt": "x", "priority": -100}', "'priority' is not"),
        ("messages", b'{"model": "m", "max_tokens": 1, "messages": [], "priority": 1}', "'prio"),
    ],
)
def test_bad_bodies_are_refused_naming_the_field(endpoint, body, message):
    with pytest.raises(GatewayError) as err:
        validate.parse(endpoint, body)
    assert err.value.status == 400
    assert message in err.value.message


def test_a_good_body_is_passed_on_as_sent():
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": true}'
    req = validate.parse("chat/completions", raw)
    assert (req.model, req.stream, req.raw) == ("m", True, raw)
    assert validate.parse("embeddings", b'{"model": "m", "input": ["a"], "user": null}').model
    # the engines' default priority is no claim on anyone's place: passed on
    assert validate.parse("completions", b'{"model": "m", "prompt": "x", "priority": 0}').model


@pytest.mark.parametrize(
    "exposition, waiting",
    [
        (b'vllm:num_requests_waiting{model_name="m"} 4.0\n', 4.0),
        (
            b"# HELP sglang:num_queue_reqs x\nsglang:num_queue_reqs 2\nsglang:num_queue_reqs 1\n",
            3.0,
        ),
        (b"llamacpp:requests_deferred 0\nllamacpp:requests_processing 5\n", 0.0),
        (b"vllm:num_requests_waiting_by_reason 9\nfake:requests_running 1\n", None),
        (b"", None),
    ],
)
def test_engine_queues_are_read_from_their_metrics_and_unknown_is_not_zero(exposition, waiting):
    assert parse_waiting(exposition) == waiting


@pytest.mark.parametrize(
    "model_own, key_own, tried",
    [
        ((), (), ()),
        (("b", "c"), (), ("b", "c")),
        ((), ("c", "b"), ("c", "b")),
        (("b",), ("c", "b", "d"), ("b", "c", "d")),  # the model's first, then the key's new ones
        (("b",), ("big", "c"), ("b", "c")),  # a key's list never sends a model to itself
    ],
)
def test_fallbacks_are_the_models_own_then_the_keys_in_order(model_own, key_own, tried):
    from fleet.gateway.keys import KeyEntry

    route = table.Route(1, "big", 0, [], fallbacks=model_own)
    key = KeyEntry(1, "k", "abcd1234", "inference", frozenset(), None, False, fallbacks=key_own)
    assert key.fallbacks_for(route) == tried


@pytest.mark.parametrize(
    "weights, expected",
    [
        # equal weights: turns alternate, the first to wait first
        ({1: 1, 2: 1}, [1, 2, 1, 2, 1, 2]),
        # weight 2: twice the turns of weight 1 while both wait
        ({1: 2, 2: 1}, [1, 2, 1, 1, 2, 1]),
    ],
)
def test_waiters_are_given_slots_in_weighted_fair_order(weights, expected):
    import asyncio
    from types import SimpleNamespace

    from fleet.gateway.fair import FairShare

    async def run() -> list[int]:
        share = FairShare(size=100, fair=True, timeout_s=5)
        keys = {k: SimpleNamespace(id=k, name=f"k{k}", max_concurrent=0, share_weight=w)
                for k, w in weights.items()}  # fmt: skip
        served: list[int] = []

        async def one(k):
            await share.wait("m", keys[k], "busy")
            served.append(k)

        # key 1 queues six, then key 2 six: arrival order is all of 1's first
        tasks = [asyncio.ensure_future(one(k)) for k in (1,) * 6 + (2,) * 6]
        await asyncio.sleep(0)
        for _ in range(6):
            share.ended("m", None)  # a request ends: one slot
            await asyncio.sleep(0)
        for t in tasks:
            t.cancel()
        return served

    assert asyncio.run(run()) == expected


def test_a_key_at_its_max_concurrent_waits_while_another_key_goes():
    import asyncio
    from types import SimpleNamespace

    from fleet.gateway.fair import FairShare

    async def run() -> list[str]:
        share = FairShare(size=10, fair=True, timeout_s=5)
        capped = SimpleNamespace(id=1, name="capped", max_concurrent=1, share_weight=1)
        other = SimpleNamespace(id=2, name="other", max_concurrent=0, share_weight=1)
        share.started(capped)  # one in flight: at its bound
        served: list[str] = []

        async def one(key):
            await share.wait("m", key, "busy")
            served.append(key.name)

        tasks = [asyncio.ensure_future(one(k)) for k in (capped, other)]
        await asyncio.sleep(0)
        share.ended("m", None)  # another key's request ends: capped may not go yet
        await asyncio.sleep(0)
        share.ended("m", capped)  # its own ends: now it may
        await asyncio.sleep(0)
        for t in tasks:
            t.cancel()
        return served

    assert asyncio.run(run()) == ["other", "capped"]


def test_asleep_replicas_are_not_routed_to_and_a_request_waits_for_their_wake():
    sleeps = table.ModelView(1, "m", 0, 1, sleeps=True)
    routes = table.build_routes(
        [sleeps],
        [
            replica("going", shard(desired="asleep")),  # its engine still finishes its requests
            replica("asleep", shard(state="asleep", desired="asleep", port=8001)),
        ],
    )
    route = routes["m"]
    assert route.upstreams == [] and route.waits and route.asleep == 2
    assert route.unavailable == "model 'm' has no ready replica: 2 asleep"
    waking = table.build_routes([sleeps], [replica("w", shard(state="asleep"))])["m"]
    assert waking.unavailable == "model 'm' has no ready replica: 1 waking"
    # a model that sleeps but wants no replica does not make requests wait for nothing
    none = table.build_routes([table.ModelView(2, "z", 0, 0, sleeps=True)], [])["z"]
    assert not none.waits
