"""The fake engine holds to real vLLM: the same requests to vLLM 0.32.0's CPU build and to
``python -m agentd.engines.fake``, and what llmgw reads from each answer compared.

What llmgw reads from a vLLM engine: the in-flight and waiting gauges (the agent's drain,
``agentd.engines.vllm.VLLM.in_flight_series``; the gateway's queue depth,
``fleet.gateway.engines.parse_waiting``) and the cache series beside them; /health's
status; usage objects, whole and as a stream's last event (``fleet.gateway.answers``);
the stream's framing; the runtime LoRA endpoints' statuses and error bodies (turned into
an adapter's reason by ``agentd.engines.base``); /v1/models with an adapter loaded; the
sleep endpoints (VLLM_SERVER_DEV_MODE=1, on for both) as far as the CPU build serves them:
it refuses --enable-sleep-mode, so its sleep pauses scheduling and releases nothing, as the
fake's does without that flag.

Each test asks both, then names every field that differs with both values. One vLLM for
the module: it takes 30–90 s to start on 2 cores.
"""

import asyncio
import concurrent.futures
import http.client
import json
import os
import re
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentd.engines.base import metric_sum
from agentd.engines.fake import FakeEngine as FakeEngineAdapter
from agentd.engines.vllm import VLLM
from agentd.tinyhf import write, write_lora
from fleet.devstack.vllm import TINY_HF_NAME
from fleet.gateway.answers import SSECheck
from fleet.gateway.engines import WAITING_METRICS, parse_waiting
from tests.engines.helpers import shard
from tests.processes import FakeEngine
from tests.processes.vllm import VllmServer, vllm_env

pytestmark = pytest.mark.live

# The series llmgw reads (the agent's drain, the gateway's queue depth), and the KV and
# prefix cache series beside them that dashboards and the real-engine tests read.
SERIES = sorted(
    {*VLLM.in_flight_series, *(w.decode() for w in WAITING_METRICS if w.startswith(b"vllm:"))}
    | {
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    }
)
LOAD, UNLOAD = VLLM.adapter_api
MISSING = re.compile(r"Loading lora a2 failed: No adapter found for <path>")


class Engine:
    """One engine, asked over plain HTTP/1.1: (status, content type, body)."""

    def __init__(self, port: int):
        self.port = port

    def ask(self, path: str, body: dict | None = None) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            if body is None:
                conn.request("GET", path)
            else:
                headers = {"Content-Type": "application/json"}
                conn.request("POST", path, json.dumps(body).encode(), headers)
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type") or "", resp.read()
        finally:
            conn.close()

    def json(self, path: str, body: dict | None = None) -> tuple[int, dict]:
        status, _, raw = self.ask(path, body)
        return status, json.loads(raw)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(vLLM, the fake), serving the same tiny model under the same name, LoRA enabled,
    with vLLM's development endpoints (the sleep API) on."""
    work = tmp_path_factory.mktemp("vllm-contract")
    model = write(work / "tiny-hf")
    # bfloat16 (TINY_HF_ARGS), as the product runs it: the environment asks for AMX's tile
    # state in every process (agentd/xtile.py), without which its first completion dies.
    real = VllmServer(
        vllm_env(),
        model,
        work / "vllm.log",
        "--enable-lora", "--max-loras", "2", "--enforce-eager",
        VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", VLLM_SERVER_DEV_MODE="1",
    )  # fmt: skip
    fake = None
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("VLLM_SERVER_DEV_MODE", "1")  # read by the fake as it starts
            fake = FakeEngine(work, TINY_HF_NAME, "--model", str(model))
        real.wait_ready()
        yield Engine(real.port), Engine(fake.port), work
    finally:
        real.stop()
        if fake is not None:
            fake.kill()


class Differences:
    """Fields whose values differ between vLLM and the fake, for one failure naming all."""

    def __init__(self):
        self.found: list[str] = []

    def same(self, field: str, real, fake) -> None:
        if real != fake:
            self.found.append(f"{field}: vLLM {real!r}, the fake {fake!r}")

    def check(self, field: str, ok: bool, values: tuple) -> None:
        """A rule each engine's answer must keep; ``values`` is (vLLM's, the fake's)."""
        if not ok:
            self.found.append(f"{field}: vLLM {values[0]!r}, the fake {values[1]!r}")

    def assert_none(self) -> None:
        assert not self.found, "the fake differs from vLLM 0.32.0:\n" + "\n".join(self.found)


def both(engines, ask):
    """``ask(engine)`` of vLLM, then of the fake."""
    real, fake, _ = engines
    return ask(real), ask(fake)


# ---- readiness and metrics ------------------------------------------------------------


def test_health_answers_200_once_ready(engines):
    diff = Differences()
    real, fake = both(engines, lambda e: e.ask("/health")[0])
    diff.same("/health status", real, fake)
    diff.check("/health status is 200", real == fake == 200, (real, fake))
    diff.assert_none()


def samples(text: str) -> dict[str, tuple[str, dict]]:
    """sample name -> (its family's type, its labels), for the series llmgw reads."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in SERIES:
                out[sample.name] = (family.type, dict(sample.labels))
    return out


def test_the_series_llmgw_reads_have_vllms_names_types_and_labels(engines):
    diff = Differences()
    real_text, fake_text = both(engines, lambda e: e.ask("/metrics")[2].decode())
    real, fake = samples(real_text), samples(fake_text)
    for name in SERIES:
        r, f = real.get(name), fake.get(name)
        diff.check(f"{name} is exposed", r is not None and f is not None, (r, f))
        if r and f:
            diff.same(f"{name} type", r[0], f[0])
            diff.same(f"{name} label keys", sorted(r[1]), sorted(f[1]))
            diff.same(f"{name} labels", r[1], f[1])
    # and llmgw's own parsers read both: the agent's in-flight count, the gateway's queue
    in_flight = (
        metric_sum(real_text, VLLM.in_flight_series),
        metric_sum(fake_text, VLLM.in_flight_series),
    )
    diff.check("in-flight (agent's drain) is read", None not in in_flight, in_flight)
    diff.same("in-flight when idle", *in_flight)
    waiting = (parse_waiting(real_text.encode()), parse_waiting(fake_text.encode()))
    diff.check("waiting (gateway's queue depth) is read", None not in waiting, waiting)
    diff.same("waiting when idle", *waiting)
    diff.assert_none()


# ---- usage and streams ----------------------------------------------------------------


def request(chat: bool, model: str = TINY_HF_NAME, **extra) -> tuple[str, dict]:
    # Greedy, to the end: the same tokens every run (the model's weights are fixed), and
    # exactly max_tokens of them, as the fake gives.
    body = {"model": model, "max_tokens": 4, "temperature": 0, "ignore_eos": True, **extra}
    if chat:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "hi"}]}
    return "/v1/completions", {**body, "prompt": "hello there"}


def usage_rules(usage) -> tuple[bool, str]:
    """Whether a usage object holds int counts that add up, and why not."""
    if not isinstance(usage, dict):
        return False, "no usage object"
    p, c, t = (usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    if not all(type(v) is int for v in (p, c, t)):
        return False, f"counts not all ints: {usage}"
    if p + c != t:
        return False, f"prompt {p} + completion {c} != total {t}"
    return True, ""


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_a_whole_answer_carries_vllms_usage_object(engines, chat):
    diff = Differences()
    path, body = request(chat)
    (rs, real), (fs, fake) = both(engines, lambda e: e.json(path, body))
    diff.same(f"{path} status", rs, fs)
    ru, fu = real.get("usage"), fake.get("usage")
    diff.same(f"{path} usage keys", sorted(ru or {}), sorted(fu or {}))
    rules = (usage_rules(ru), usage_rules(fu))
    diff.check(f"{path} usage counts", rules[0][0] and rules[1][0], (rules[0][1], rules[1][1]))
    diff.same(
        f"{path} usage completion_tokens",
        *((u or {}).get("completion_tokens") for u in (ru, fu)),
    )
    diff.same(f"{path} object", real.get("object"), fake.get("object"))
    diff.same(f"{path} model", real.get("model"), fake.get("model"))
    choice = (real["choices"][0], fake["choices"][0])
    keys = [
        sorted(k for k in c if k in ("index", "message", "text", "finish_reason")) for c in choice
    ]
    diff.same(f"{path} choice keys llmgw reads", *keys)
    diff.same(f"{path} finish_reason", *(c["finish_reason"] for c in choice))
    diff.assert_none()


def events(raw: bytes) -> tuple[list, str]:
    """A stream's events: the JSON of each ``data:`` event, or "[DONE]"; and what is not
    framed as ``data: ...`` followed by a blank line ("" when all is)."""
    text = raw.decode()
    if not text.endswith("\n\n"):
        return [], f"does not end with a blank line: {text[-40:]!r}"
    out = []
    for block in text[:-2].split("\n\n"):
        if not block.startswith("data: ") or "\n" in block:
            return out, f"an event that is not one 'data: ' line: {block[:80]!r}"
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out, ""


def shape(evs: list) -> list[str]:
    """The stream as what llmgw tells apart: the role, tokens, usage, [DONE].

    A run of token events is one entry: vLLM merges the tokens a slow reader has not taken
    yet into one event, so how many events carry them varies from run to run."""
    out: list[str] = []
    for ev in evs:
        if ev == "[DONE]":
            kind = "[DONE]"
        elif ev.get("choices") == [] and "usage" in ev:
            kind = "usage only"
        elif ev.get("usage") is not None:
            kind = "usage with choices"
        else:
            (choice,) = ev["choices"]
            delta = choice.get("delta") or {}
            if "role" in delta:
                kind = f"role {delta['role']} {delta.get('content')!r}"
            else:
                kind = "tokens"
        if not out or out[-1] != kind:
            out.append(kind)
    return out


def finishes(evs: list) -> list:
    """The finish_reason of each token event: None on all but the last."""
    return [
        c.get("finish_reason")
        for ev in evs
        if ev != "[DONE]"
        for c in ev.get("choices") or []
        if "role" not in (c.get("delta") or {})
    ]


def carrying_text(evs: list) -> int:
    """Events whose choice carries generated text."""
    return sum(
        1
        for ev in evs
        if ev != "[DONE]"
        for c in ev.get("choices") or []
        if (c.get("delta") or {}).get("content") or c.get("text")
    )


def gateway_reads(raw: bytes) -> dict:
    """What the gateway's stream check makes of a stream (fleet.gateway.answers.SSECheck)."""
    check = SSECheck(strip_usage=True)
    passed, problem = check.feed(raw)
    return {
        "[DONE] seen": check.done,
        "usage keys": sorted(check.usage or {}),
        "problem": problem,
        "usage-only event let through": b'"choices":[]' in passed,
        "text events": check.events,
    }


@pytest.mark.parametrize("usage", [True, False], ids=["include_usage", "no-usage"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_a_stream_is_framed_as_vllm_frames_it(engines, chat, usage):
    diff = Differences()
    options = {"stream_options": {"include_usage": True}} if usage else {}
    path, body = request(chat, stream=True, **options)
    (rs, rtype, rraw), (fs, ftype, fraw) = both(engines, lambda e: e.ask(path, body))
    diff.same(f"{path} stream status", rs, fs)
    diff.same(f"{path} stream content type", rtype, ftype)
    (revs, rbad), (fevs, fbad) = events(rraw), events(fraw)
    diff.check(f"{path} stream framing", not rbad and not fbad, (rbad, fbad))
    diff.same(f"{path} stream events", shape(revs), shape(fevs))
    ends = (finishes(revs), finishes(fevs))
    diff.same(f"{path} stream's last finish_reason", *(e[-1:] for e in ends))
    diff.check(
        f"{path} stream: a finish_reason on the last token event only",
        all(e and not any(e[:-1]) for e in ends),
        ends,
    )
    diff.same(
        f"{path} stream objects",
        *({e["object"] for e in evs if e != "[DONE]"} for evs in (revs, fevs)),
    )
    if usage:
        ru, fu = revs[-2].get("usage"), fevs[-2].get("usage")
        diff.same(f"{path} stream usage keys", sorted(ru or {}), sorted(fu or {}))
        diff.same(
            f"{path} stream usage completion_tokens",
            *((u or {}).get("completion_tokens") for u in (ru, fu)),
        )
        rules = (usage_rules(ru), usage_rules(fu))
        diff.check(
            f"{path} stream usage counts", rules[0][0] and rules[1][0], (rules[0][1], rules[1][1])
        )
    # and the gateway reads both alike: the end, the usage, the events that carry text,
    # with the usage-only event it asked for taken out
    real_read, fake_read = gateway_reads(rraw), gateway_reads(fraw)
    for field in ("[DONE] seen", "usage keys", "problem", "usage-only event let through"):
        diff.same(f"{path} gateway's SSECheck: {field}", real_read[field], fake_read[field])
    # a token for each event that carries text, where no usage is sent: as many as the
    # stream has, never more than it generated
    counted = (real_read["text events"], fake_read["text events"])
    texts = (carrying_text(revs), carrying_text(fevs))
    diff.check(
        f"{path} gateway's SSECheck: text events counted",
        counted == texts,
        (f"{counted[0]} of {texts[0]}", f"{counted[1]} of {texts[1]}"),
    )
    diff.check(
        f"{path} events carrying text, 1 to max_tokens",
        all(1 <= t <= body["max_tokens"] for t in texts),
        texts,
    )
    diff.assert_none()


# ---- LoRA adapters ----------------------------------------------------------------------


def error_of(answer: bytes) -> dict:
    try:
        return json.loads(answer).get("error") or {}
    except ValueError:
        return {"not JSON": answer[:200].decode(errors="replace")}


def test_lora_adapters_load_list_serve_and_unload_as_in_vllm(engines):
    diff = Differences()
    real, fake, work = engines
    adapter = write_lora(work / "lora-a1")
    missing = str(work / "no-such-adapter")

    def steps(e: Engine) -> dict:
        out = {}
        out["load"] = e.ask(LOAD, {"lora_name": "a1", "lora_path": str(adapter)})
        out["load again"] = e.ask(LOAD, {"lora_name": "a1", "lora_path": str(adapter)})
        out["load a missing path"] = e.ask(LOAD, {"lora_name": "a2", "lora_path": missing})
        out["load without a path"] = e.ask(LOAD, {"lora_name": "a3"})
        out["models"] = e.json("/v1/models")
        out["complete as the adapter"] = e.json(*request(False, model="a1"))
        out["unload"] = e.ask(UNLOAD, {"lora_name": "a1"})
        out["unload again"] = e.ask(UNLOAD, {"lora_name": "a1"})
        out["models after"] = e.json("/v1/models")
        return out

    r, f = steps(real), steps(fake)

    for step in ("load", "unload"):
        diff.same(f"{step}: status", r[step][0], f[step][0])
        diff.same(f"{step}: answer", r[step][2], f[step][2])
    for step in ("load again", "load a missing path", "load without a path", "unload again"):
        diff.same(f"{step}: status", r[step][0], f[step][0])
        re_, fe = error_of(r[step][2]), error_of(f[step][2])
        for key in ("type", "code", "param"):
            diff.same(f"{step}: error.{key}", re_.get(key), fe.get(key))
        if step != "load without a path":  # pydantic's words, not vLLM's
            diff.same(f"{step}: error.message", re_.get("message"), fe.get("message"))
    # vLLM keeps the path out of its answer: "<path>" stands where it would be
    said = tuple(error_of(e["load a missing path"][2]).get("message") or "" for e in (r, f))
    diff.check(
        "load a missing path: error.message matches 'Loading lora a2 failed: No adapter "
        "found for <path>'",
        all(MISSING.fullmatch(m) for m in said),
        said,
    )

    def listed(answer) -> list:
        status, body = answer
        return [status] + [
            {k: m.get(k) for k in ("id", "object", "owned_by", "parent", "root", "max_model_len")}
            for m in body.get("data", [])
        ]

    diff.same("/v1/models with a1 loaded", listed(r["models"]), listed(f["models"]))
    diff.same(
        "/v1/models after a1 is unloaded", listed(r["models after"]), listed(f["models after"])
    )
    rs, rbody = r["complete as the adapter"]
    fs, fbody = f["complete as the adapter"]
    diff.same("a completion as a1: status", rs, fs)
    diff.same("a completion as a1: model", rbody.get("model"), fbody.get("model"))
    diff.assert_none()


def test_the_agent_reads_adapter_answers_alike(engines):
    # given the agent's own calls (agentd.engines.base), as the supervisor makes them
    diff = Differences()
    real, fake, work = engines
    adapter = str(write_lora(work / "lora-b1"))
    missing = str(work / "no-such-adapter")
    vllm = VLLM()

    async def calls(e: Engine) -> list[str]:
        host = "127.0.0.1"
        return [
            await vllm.load_adapter(host, e.port, "b1", adapter),
            await vllm.load_adapter(host, e.port, "b2", missing),
            await vllm.unload_adapter(host, e.port, "b1"),
            await vllm.unload_adapter(host, e.port, "b1"),
        ]

    # when each engine is asked the same
    r, f = asyncio.run(calls(real)), asyncio.run(calls(fake))
    # then an adapter's reason (what operators see) is word for word the same
    names = (
        "load: reason",
        "load a missing path: reason",
        "unload: reason",
        "unload again: reason",
    )
    for name, rv, fv in zip(names, r, f, strict=True):
        diff.same(name, rv, fv)
    diff.check("a load that worked has no reason", r[0] == f[0] == "", (r[0], f[0]))
    diff.check(
        "a missing path is the engine's 404",
        all(v.startswith(f"{LOAD} answered 404: ") for v in (r[1], f[1])),
        (r[1], f[1]),
    )
    diff.assert_none()


# ---- sleep and wake ---------------------------------------------------------------------


def call(e: Engine, method: str, path: str, body=None) -> tuple[int, object]:
    """(status, JSON answer or None) of any method, a body sent as it is given (bytes raw)."""
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=120)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def sleep_states(e: Engine) -> dict:
    """vllm:engine_sleep_state's samples: its sleep_state label -> (other labels, value)."""
    text = e.ask("/metrics")[2].decode()
    return {
        s.labels["sleep_state"]: ({k: v for k, v in s.labels.items() if k != "sleep_state"},
                                  s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vllm:engine_sleep_state"
    }  # fmt: skip


def test_the_cpu_build_refuses_sleep_mode_as_it_starts(engines, tmp_path):
    # given vLLM's CPU build started as the agent would start a GPU shard that sleeps
    # (about 9 s on 2 cores: it fails before it loads anything)
    env = vllm_env()
    model = write(tmp_path / "tiny-hf")
    argv = [str(env / "bin" / "python"), "-m", VLLM.MODULE, "--model", str(model),
            "--port", "1", "--enable-sleep-mode"]  # fmt: skip
    run_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run_env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_SERVER_DEV_MODE="1")
    done = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=300)
    # then it exits with pydantic's refusal of ModelConfig (vllm/config/model.py)
    assert done.returncode == 1
    assert "Sleep mode is not supported on current platform." in done.stderr, done.stderr[-2000:]
    # which is why a CPU shard sleeps by stopping, and the fake stands in for GPUs' sleep
    cpu = shard(engine="vllm", sleep_level=1)
    assert not VLLM().sleeps_in_place(cpu) and FakeEngineAdapter().sleeps_in_place(cpu)


def test_without_dev_mode_the_sleep_endpoints_are_unknown_paths_as_in_vllm(engines, tmp_path):
    # vLLM attaches the sleep router only with VLLM_SERVER_DEV_MODE=1 (its api_server's
    # routers.py): without it /sleep is any unknown path, which vLLM answers so.
    diff = Differences()
    real, _, _ = engines
    unknown = call(real, "POST", "/no-such-endpoint")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_SERVER_DEV_MODE", "0")
        plain = FakeEngine(tmp_path, TINY_HF_NAME)
    try:
        for method, path in (("POST", "/sleep?level=1"), ("POST", "/wake_up"),
                             ("GET", "/is_sleeping"), ("POST", "/collective_rpc")):  # fmt: skip
            diff.same(
                f"{method} {path} without dev mode", unknown, call(Engine(plain.port), method, path)
            )
    finally:
        plain.kill()
    diff.assert_none()


def test_the_sleep_endpoints_answer_as_vllms(engines):
    diff = Differences()
    real, fake, _ = engines

    def refusals(e: Engine) -> dict:
        return {
            f"{m} {p} {b!r}": call(e, m, p, b)
            for m, p, b in [
                ("GET", "/sleep", None),
                ("POST", "/is_sleeping", None),
                ("POST", "/sleep?level=3", None),
                ("POST", "/sleep?level=-1", None),
                ("POST", "/sleep?level=x", None),
                ("POST", "/sleep?mode=nap", None),
                ("POST", "/sleep?level=5&mode=nap", None),
                ("POST", "/collective_rpc", None),
                ("POST", "/collective_rpc", [1]),
                ("POST", "/collective_rpc", {}),
                ("POST", "/collective_rpc", {"method": "no_such_method"}),
            ]
        }

    r, f = refusals(real), refusals(fake)
    for asked in r:
        diff.same(asked, r[asked], f[asked])
    diff.assert_none()


def test_a_sleep_pauses_queues_and_wakes_as_vllms(engines):
    diff = Differences()
    real, fake, _ = engines
    vllm = VLLM()
    path, body = request(False)

    def steps(e: Engine) -> dict:
        out = {"is_sleeping awake": call(e, "GET", "/is_sleeping"), "gauge awake": sleep_states(e)}
        try:
            # the agent's own sleep (agentd.engines.base), as the supervisor makes it
            out["sleep, level 1: reason"] = asyncio.run(vllm.sleep("127.0.0.1", e.port, 1))
            out["is_sleeping asleep"] = call(e, "GET", "/is_sleeping")
            out["health asleep"] = e.ask("/health")[0]
            out["gauge asleep"] = sleep_states(e)
            out["sleep again"] = call(e, "POST", "/sleep?level=1&mode=wait")
            out["wake a tag that is not asleep"] = call(e, "POST", "/wake_up?tags=bogus")
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                queued = pool.submit(e.json, path, body)
                time.sleep(2)
                out["a completion sent asleep: answered before the wake"] = queued.done()
                out["wake"] = call(e, "POST", "/wake_up")
                status, answer = queued.result(60)
            out["the queued completion"] = (status, answer["choices"][0]["finish_reason"])
            # level 2, and the agent's way back from it: weights, reload, KV cache
            out["sleep, level 2"] = call(e, "POST", "/sleep?level=2&mode=wait")
            out["gauge at level 2"] = sleep_states(e)
            for wake_path, wake_body in vllm.wake_calls(shard(engine="vllm", sleep_level=2)):
                out[f"wake: {wake_path}"] = call(e, "POST", wake_path, wake_body)
            status, answer = e.json(path, body)
            out["a completion after"] = (status, answer["choices"][0]["finish_reason"])
            out["gauge awake again"] = sleep_states(e)
        finally:
            call(e, "POST", "/wake_up")  # whatever failed, the module's engines serve on
        return out

    r, f = steps(real), steps(fake)
    for step in r:
        diff.same(step, r[step], f[step])
    diff.check(
        "the sleep worked",
        r["sleep, level 1: reason"] == "",
        tuple(x["sleep, level 1: reason"] for x in (r, f)),
    )
    diff.check("a queued completion waits for the wake",
               not r["a completion sent asleep: answered before the wake"],
               (r["a completion sent asleep: answered before the wake"],
                f["a completion sent asleep: answered before the wake"]))  # fmt: skip
    diff.assert_none()
