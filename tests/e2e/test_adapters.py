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


def test_an_adapter_outside_the_nodes_roots_or_on_an_internal_address_is_refused(
    stack, tiny_model, tmp_path
):
    from agentd.tinygguf import write_lora
    from tests.processes.weights_server import WeightsServer

    pirate = write_lora(tmp_path / "lora" / "pirate.gguf", seed=1)
    weights = tmp_path / "cpu-a-weights"
    with WeightsServer() as server:
        server.files["pirate.gguf"] = pirate.read_bytes()

        # given: a node naming its test tree for local weights (tests.processes'
        # default) and allowing no internal address, and a model holding two adapters
        stack.add_agent("cpu-a", weights_dirs=[str(weights)])
        model_id = apply_model(stack, tiny_model, profile_fields={"max_adapters": 2})

        # when: its adapters name a file outside every root and a URL on 127.0.0.1
        for name, source in (
            ("tiny-etc", "/etc/passwd"),
            ("tiny-inside", server.url("pirate.gguf")),
        ):
            stack.api("post", "adapters/", json={"name": name, "model": model_id, "source": source})
        wait_serving(stack)
        stack.wait(
            lambda: (
                held("tiny-etc").get("state") == "failed"
                and held("tiny-inside").get("state") == "failed"
            ),
            "both adapters to be refused",
        )

        # then: each is failed with the node's reason, naming what to change
        assert held("tiny-etc")["error"] == (
            "adapter tiny-etc's source /etc/passwd is not under a directory this node's "
            f"agent.yaml names for weights (weights_dirs or model_dirs: {weights}, {stack.tmp}); "
            "add its directory to model_dirs on this node to allow it. Nothing was read"
        )
        assert held("tiny-inside")["error"] == (
            f"fetching it failed: {server.url('pirate.gguf')}: 127.0.0.1 is 127.0.0.1, a "
            "loopback address; this node fetches from internal addresses only where its "
            "agent.yaml allows them (fetch.allow_private_addresses, or its network in "
            "fetch.allow_networks). Nothing was fetched"
        )
        # and nothing was asked of the server or written, nor told to the engine
        assert server.requests == []
        assert not weights.exists() or list(weights.iterdir()) == []
        (shard,) = Shard.objects.filter(replica__model__name="tiny-llama", state="ready")
        cmdline = open(f"/proc/{stack.agents[0].engines()[shard.pk]}/cmdline").read()
        assert "/etc/passwd" not in cmdline and "--lora" not in cmdline
    # and the model itself serves
    assert answers(stack)
