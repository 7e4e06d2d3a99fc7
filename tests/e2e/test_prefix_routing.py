"""Prefix-aware routing over the whole stack: two llama.cpp replicas on two agents, a model
switched on through the API, and requests that share system prompts."""

import pytest

from fleet.gateway import prefix, table
from fleet.models import Replica
from tests.e2e.helpers import apply_model, wait_serving

pytestmark = pytest.mark.django_db(transaction=True)


def system_prompt(n: int) -> str:
    # Longer than GATEWAY_PREFIX_CHARS (1024): the question after it does not count.
    return f"You are helper {n} of the fleet. Say what you know, and say it well. " * 16


def owner_of(ring: prefix.Ring, system: str) -> str:
    body = {"messages": [{"role": "system", "content": system}]}
    return ring.owner(prefix.key_of("chat/completions", body, 1024)).replica_id


def test_requests_sharing_a_system_prompt_stay_on_one_llama_cpp_replica(stack, tiny_model):
    # given: two CPU nodes, and the model with prefix routing on, one replica on each
    stack.add_agent("cpu-a")
    stack.add_agent("cpu-b")
    model_id = apply_model(
        stack, tiny_model, replicas=2, placement_policy="spread", prefix_routing=True
    )
    shards = wait_serving(stack, count=2)
    assert {s.node_id for s in shards} == {"cpu-a", "cpu-b"}
    assert stack.api("get", f"models/{model_id}/")["prefix_routing"] is True
    replicas = list(Replica.objects.filter(model_id=model_id, state="ready"))
    ring = prefix.Ring([table.Upstream(r.pk, "tiny-llama", "http://x:1", "") for r in replicas])
    owner = {system_prompt(n): owner_of(ring, system_prompt(n)) for n in range(40)}
    systems = [s for s in owner if owner[s] == replicas[0].pk][:2]
    systems += [s for s in owner if owner[s] == replicas[1].pk][:2]

    # when: each system prompt is asked three questions through the gateway, interleaved
    client = stack.openai(timeout=60)
    seen: dict[str, set] = {s: set() for s in systems}
    for q in range(3):
        for s in systems:
            reply = client.chat.completions.with_raw_response.create(
                model="tiny-llama",
                messages=[
                    {"role": "system", "content": s},
                    {"role": "user", "content": f"Question {q}?"},
                ],
                max_tokens=2,
            )
            assert reply.parse().choices[0].finish_reason in ("length", "stop")
            seen[s].add(reply.headers["x-llmgw-replica"])

    # then: every answer to one system prompt came from that prompt's replica, and
    # both replicas answered some
    assert seen == {s: {owner[s]} for s in systems}
