"""The fake engine's own options, as a real process (``python -m agentd.engines.fake``)."""

import json
import urllib.error
import urllib.request

import pytest

from tests.processes import FakeEngine, wait_for

pytestmark = pytest.mark.live


def test_log_flood_writes_lines_of_the_asked_size_and_the_engine_still_answers(tmp_path):
    engine = FakeEngine(tmp_path, "tiny", "--log-flood", "500", "--log-flood-line-bytes", "120")
    try:

        def flood_lines():
            text = engine.log.read_bytes()
            whole = text.split(b"\n")[:-1]  # the last may still be being written
            lines = [ln for ln in whole if b"flood line" in ln]
            return lines if len(lines) >= 200 else None

        lines = wait_for(flood_lines, "200 flood lines in the engine's output", 30)

        assert {len(ln) + 1 for ln in lines} == {120}  # the newline included
        numbers = [int(ln.split()[4]) for ln in lines]
        assert numbers == list(range(len(numbers))), "in order, none lost"
        health = urllib.request.urlopen(f"http://127.0.0.1:{engine.port}/health", timeout=10)
        assert health.status == 200
    finally:
        engine.kill()


def test_a_stream_ends_with_a_usage_only_event_when_asked_as_vllm_does(tmp_path):
    engine = FakeEngine(tmp_path, "tiny")
    try:

        def stream(**extra) -> list:
            body = {"model": "tiny", "max_tokens": 3, "stream": True, "prompt": "hi", **extra}
            req = urllib.request.Request(
                f"http://127.0.0.1:{engine.port}/v1/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                text = resp.read().decode()
            return [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]

        plain = stream()
        asked = stream(stream_options={"include_usage": True})
    finally:
        engine.kill()
    assert plain[-1] == "[DONE]" and all("usage" not in e for e in plain)
    last = json.loads(asked[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    assert len(asked) == len(plain) + 1


def test_fail_every_answers_500_to_every_nth_completion_and_serves_the_rest(tmp_path):
    engine = FakeEngine(tmp_path, "tiny", "--fail-every", "3")
    try:

        def ask() -> tuple[int, dict]:
            req = urllib.request.Request(
                f"http://127.0.0.1:{engine.port}/v1/completions",
                data=json.dumps({"model": "tiny", "max_tokens": 2, "prompt": "hi"}).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    return resp.status, json.load(resp)
            except urllib.error.HTTPError as exc:
                return exc.code, json.load(exc)

        answers = [ask() for _ in range(9)]
    finally:
        engine.kill()
    assert [status for status, _ in answers] == [200, 200, 500] * 3
    assert answers[2][1]["error"]["type"] == "InternalServerError"  # as vLLM names its 500s
    assert answers[3][1]["choices"][0]["text"] == "the quick"
