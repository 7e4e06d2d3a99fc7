"""LoRA adapters over real processes: adapters the test writes for the generated tiny
model, declared through the API, loaded by llama.cpp's server on the agent's node, and
asked for by name through the gateway with the official client."""

import pytest

from fleet.models import Adapter, Shard
from tests.e2e.helpers import answers, apply_model, wait_serving

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = [{"role": "user", "content": "Tell me a story"}]


def story(stack, model: str) -> str:
    """A fixed-seed answer at temperature 0: the same weights give the same words."""
    reply = stack.openai(timeout=120).chat.completions.create(
        model=model, messages=PROMPT, max_tokens=12, temperature=0, seed=1
    )
    return reply.choices[0].message.content


def held(name: str) -> dict:
    """What the model's serving shard reports of ``name`` (empty if nothing)."""
    for shard in Shard.objects.filter(replica__model__name="tiny-llama", state="ready"):
        for a in shard.adapters:
            if a["name"] == name:
                return a
    return {}


def test_adapters_answer_by_name_load_on_demand_and_a_broken_one_is_reported(
    stack, tiny_model, tmp_path
):
    from agentd.tinygguf import write_lora

    pirate = write_lora(tmp_path / "lora" / "pirate.gguf", seed=1)
    poet = write_lora(tmp_path / "lora" / "poet.gguf", seed=2)
    broken = tmp_path / "lora" / "broken.gguf"
    broken.write_bytes(pirate.read_bytes()[:200])  # a download cut short

    # given: one CPU node, the model with a profile holding one adapter at a time,
    # and two adapters of it declared through the API
    stack.add_agent("cpu-a")
    model_id = apply_model(stack, tiny_model, profile_fields={"max_adapters": 1})
    for name, path in (("tiny-pirate", pirate), ("tiny-poet", poet)):
        stack.api("post", "adapters/", json={"name": name, "model": model_id, "source": str(path)})
    wait_serving(stack)
    stack.wait(lambda: held("tiny-pirate").get("state") == "loaded", "tiny-pirate to be loaded")

    # then: the client lists the adapters beside the model, naming their base
    listed = {m.id: m for m in stack.openai().models.list()}
    assert set(listed) == {"tiny-llama", "tiny-pirate", "tiny-poet"}
    assert listed["tiny-pirate"].model_extra["parent"] == "tiny-llama"

    # and the adapter answers from its own weights, the base from the base's
    base = story(stack, "tiny-llama")
    assert story(stack, "tiny-llama") == base, "a fixed seed gives the same answer"
    from_pirate = story(stack, "tiny-pirate")
    assert from_pirate != base

    # when: the other adapter is asked for, which no replica holds
    from_poet = story(stack, "tiny-poet")

    # then: it was loaded on demand in the least recently used one's place, and answered
    assert from_poet not in (base, from_pirate)
    assert held("tiny-poet").get("state") == "loaded"
    assert held("tiny-pirate") == {}
    assert Adapter.objects.get(name="tiny-poet").last_request_at is not None
    # and the first one comes back when asked for, answering as before
    assert story(stack, "tiny-pirate") == from_pirate
    assert stack.wait(lambda: answers(stack), "the base model to answer")
    assert story(stack, "tiny-llama") == base

    # when: an adapter whose file is corrupt is declared and asked for
    stack.api(
        "post", "adapters/", json={"name": "tiny-broken", "model": model_id, "source": str(broken)}
    )
    client = stack.openai()
    stack.wait(
        lambda: "tiny-broken" in {m.id for m in client.models.list()}, "the gateway to route it"
    )
    import openai

    with pytest.raises(openai.APIStatusError) as refused:
        story(stack, "tiny-broken")

    # then: it is refused with the engine's reason, which the API shows too
    assert refused.value.status_code == 503
    assert "tiny-broken" in refused.value.message and "failed to load" in refused.value.message
    (where,) = stack.api("get", "adapters/", params={"search": "tiny-broken"})["results"][0][
        "loaded"
    ]
    assert where["state"] == "failed" and "lora" in where["error"].lower(), where

    # and the replica kept serving the model itself
    assert stack.wait(lambda: answers(stack), "the base model to answer")
    assert story(stack, "tiny-llama") == base
