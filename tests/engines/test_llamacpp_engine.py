"""The real llama.cpp engine (llama-cpp-python's server) on the generated tiny model."""

import json
import os
import signal
import sys

import pytest

from agentd.engines.llamacpp import LlamaCpp
from agentd.tinygguf import write as write_tiny_model
from tests.engines.helpers import Recorder, desired, fake_supervisor, http_post, profile, shard

pytestmark = pytest.mark.live


async def test_real_engine_becomes_ready_answers_and_its_death_is_reported(state_dir, tmp_path):
    model = write_tiny_model(tmp_path / "tiny.gguf")
    prof = profile("llamacpp", model_path=str(model), served_model_name="tiny")
    spec = shard("tiny-s0", engine="llamacpp", profile=prof, startup_timeout_s=120)
    rec = Recorder()
    # llama.cpp as agent.yaml names it: the test virtualenv's llama-cpp-python.
    sup = fake_supervisor(state_dir, rec, binaries={"llamacpp": sys.executable})
    await sup.start()
    try:
        assert sup.engine_versions()["llamacpp"] == LlamaCpp().version()
        await sup.apply(desired(1, spec))
        await rec.wait_for("tiny-s0", "ready", timeout=120)
        port = sup.running_shards()[0].port

        # when a client asks for a chat completion, then the engine answers it
        status, body = await http_post(
            port,
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8},
        )
        assert status == 200, body
        answer = json.loads(body)
        assert answer["object"] == "chat.completion"
        assert isinstance(answer["choices"][0]["message"]["content"], str)
        assert answer["usage"]["completion_tokens"] >= 1

        status, body = await http_post(
            port, "/v1/completions", {"prompt": "the", "max_tokens": 4, "stream": True}
        )
        assert status == 200
        events = [ln for ln in body.decode().splitlines() if ln.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 2

        # when the engine is killed, then the shard is failed with the signal and its output
        os.kill(sup.process_groups()["tiny-s0"], signal.SIGKILL)
        failed = await rec.wait_for("tiny-s0", "failed")
        assert failed.exit_code == -signal.SIGKILL
        assert failed.error == "the engine was killed by SIGKILL"
        assert any("Uvicorn running" in ln or "llama" in ln.lower() for ln in failed.last_output)
    finally:
        await sup.close()
