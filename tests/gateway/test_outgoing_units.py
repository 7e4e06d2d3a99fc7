"""What the engine is sent for a stream whose client did not ask for usage: the client's
own bytes with the question added, where that is the only change, and the body written
out again where anything else changes. Without a database."""

import json

import pytest

from fleet.gateway import table, validate
from fleet.gateway.outgoing import upstream_body, usage_asked

MODEL = table.ModelView(1, "qwen", 1700000000, 1)


def route_to(served: str) -> table.Route:
    shard = table.ShardView(0, "ready", "running", "n1", "10.0.0.7", 8000, "ready", "", ())
    replica = table.ReplicaView("a", 1, "ready", "", served, (shard,), 1, "gpu", "vllm", 0)
    return table.build_routes([MODEL], [replica])["qwen"]


def parsed(raw: bytes):
    return validate.parse("chat/completions", raw)


STREAM = {"model": "qwen", "stream": True, "messages": [{"role": "user", "content": "hé " * 50}]}


@pytest.mark.parametrize(
    "raw",
    [
        json.dumps(STREAM).encode(),
        json.dumps(STREAM, separators=(",", ":"), ensure_ascii=False).encode() + b" \r\n\t",
        json.dumps({**STREAM, "messages": [{"role": "user", "content": '} " }'}]}).encode(),
    ],
)
async def test_a_stream_that_did_not_ask_for_usage_is_sent_its_own_bytes_with_the_question(raw):
    route = route_to("qwen")
    req = parsed(raw)
    body, strip = await upstream_body(route, req, route.upstreams[0])
    assert strip is True
    assert body == usage_asked(route, req, route.upstreams[0])
    assert body.startswith(raw.rstrip()[:-1])
    assert json.loads(body) == {**req.body, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize(
    "served, extra, encoding",
    [
        # the engine serves another name: the body is written out with it
        ("qwen-served", {}, "utf-8"),
        # the client sent stream_options of its own (null, or without include_usage)
        ("qwen", {"stream_options": None}, "utf-8"),
        ("qwen", {"stream_options": {"continuous_usage_stats": True}}, "utf-8"),
        # a body in UTF-16 (JSON allows it): written out as UTF-8
        ("qwen", {}, "utf-16"),
    ],
)
async def test_anything_else_changed_writes_the_body_out_again(served, extra, encoding):
    route = route_to(served)
    raw = json.dumps({**STREAM, **extra}).encode(encoding)
    req = parsed(raw)
    assert usage_asked(route, req, route.upstreams[0]) is None
    body, strip = await upstream_body(route, req, route.upstreams[0])
    sent = json.loads(body)
    assert strip is True
    assert sent["model"] == served
    assert sent["stream_options"] == {**(extra.get("stream_options") or {}), "include_usage": True}
    assert sent["messages"] == STREAM["messages"]


async def test_a_client_that_asked_for_usage_is_sent_its_own_bytes_untouched():
    route = route_to("qwen")
    raw = json.dumps({**STREAM, "stream_options": {"include_usage": True}}).encode()
    body, strip = await upstream_body(route, parsed(raw), route.upstreams[0])
    assert (body, strip) == (raw, False)
