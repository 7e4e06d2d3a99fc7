"""The fake engine's own options, as a real process (``python -m agentd.engines.fake``)."""

import json
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
        assert json.load(health) == {"status": "ok"}
    finally:
        engine.kill()
