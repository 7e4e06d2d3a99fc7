"""The node's re-check of a clean-up proposal, path by path, and its structured reply."""

import os
import subprocess
import sys
import time

import pytest

from agentd import nvml, protocol
from tests.agent import nvml_data
from tests.agent.test_agent_messages import RecordingShards, make_agent


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    path = nvml_data.write(tmp_path / "nvml.json", nvml_data.hgx(count=2))
    monkeypatch.setenv(nvml.FAKE_ENV, str(path))
    return path


class Shards(RecordingShards):
    def __init__(self, paths_in_use=(), groups=None):
        super().__init__(paths_in_use)
        self.groups = dict(groups or {})

    def process_groups(self):
        return self.groups


def proposal(paths, version=0, request_id="r1"):
    return protocol.RemoveWeights(
        type="remove_weights",
        paths=[str(p) for p in paths],
        desired_version=version,
        request_id=request_id,
    )


def desired(version, *model_paths):
    return protocol.Desired(
        type="desired",
        version=version,
        shards=[
            protocol.DesiredShard(
                shard_id=f"s{i}",
                replica_id=f"r{i}",
                model="m",
                state="running",
                profile=protocol.ProfileSpec(name="p", engine="llamacpp", model_path=p),
            )
            for i, p in enumerate(model_paths)
        ],
    )


def kept(ack) -> dict:
    return {os.path.basename(k.path): k.reason for k in ack.kept}


def test_unused_weights_go_and_the_reply_names_each_path(tmp_path, gpus):
    w = tmp_path / "weights"
    w.mkdir()
    (w / "old.gguf").write_bytes(b"x" * 10)
    (w / "serving.gguf").write_bytes(b"y" * 10)
    agent = make_agent(tmp_path, shards=Shards([str(w / "serving.gguf")]))
    agent.register_message()  # what the control plane saw

    ack = agent.on_remove_weights(proposal([w / "old.gguf", w / "serving.gguf"]))

    assert (ack.of, ack.request_id, ack.ok) == ("remove_weights", "r1", False)
    assert ack.removed == [str(w / "old.gguf")] and not (w / "old.gguf").exists()
    assert kept(ack) == {"serving.gguf": f"in use by a shard here ({w / 'serving.gguf'})"}
    assert (w / "serving.gguf").exists()


def test_a_proposal_against_a_desired_set_not_applied_yet_keeps_everything(tmp_path, gpus):
    w = tmp_path / "weights"
    w.mkdir()
    (w / "a.gguf").write_bytes(b"x")
    agent = make_agent(tmp_path)
    agent.register_message()
    agent.desired_version = 4

    ack = agent.on_remove_weights(proposal([w / "a.gguf"], version=5))

    assert ack.removed == [] and (w / "a.gguf").exists()
    assert kept(ack) == {"a.gguf": "proposed against desired set v5, this node has applied v4"}


def test_weights_a_desired_set_still_being_applied_wants_are_kept(tmp_path, gpus):
    w = tmp_path / "weights"
    w.mkdir()
    (w / "next.gguf").write_bytes(b"x")
    (w / "fetched").mkdir()
    (w / "fetched" / "model.gguf").write_bytes(b"z")
    agent = make_agent(tmp_path)
    agent.register_message()
    # The fetched entry's source, as the agent reported it.
    agent._sent_weights = [
        protocol.Weights(path=str(w / "next.gguf"), size_bytes=1),
        protocol.Weights(path=str(w / "fetched"), size_bytes=1, source="hf://org/m"),
    ]
    # v2 arrived (a shard placed a moment ago) and is not applied yet.
    agent.on_desired(desired(2, str(w / "next.gguf"), "hf://org/m"))

    ack = agent.on_remove_weights(proposal([w / "next.gguf", w / "fetched"], version=0))

    assert ack.removed == []
    assert kept(ack) == {
        "next.gguf": f"in use by a shard here ({w / 'next.gguf'})",
        "fetched": "in use by a shard here (hf://org/m)",
    }


def test_weights_changed_since_the_report_or_never_reported_are_kept(tmp_path, gpus):
    w = tmp_path / "weights"
    w.mkdir()
    (w / "grew.gguf").write_bytes(b"x" * 10)
    agent = make_agent(tmp_path)
    agent.register_message()
    (w / "grew.gguf").write_bytes(b"x" * 20)  # rewritten after the report
    (w / "new.gguf").write_bytes(b"n")

    ack = agent.on_remove_weights(proposal([w / "grew.gguf", w / "new.gguf"]))

    assert kept(ack) == {
        "grew.gguf": "changed since it was reported (10 bytes then, 20 now)",
        "new.gguf": "not among the weights this node last reported",
    }
    assert (w / "grew.gguf").exists() and (w / "new.gguf").exists()


def test_a_file_an_engine_process_holds_open_is_kept(tmp_path, gpus):
    w = tmp_path / "weights"
    w.mkdir()
    held = w / "held.gguf"
    held.write_bytes(b"g" * 4096)
    # A real process in its own group maps the file, as llama.cpp maps a GGUF.
    ready = tmp_path / "ready"
    code = (
        "import mmap, sys, time, pathlib\n"
        f"f = open({str(held)!r}, 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "f.close()\n"
        f"pathlib.Path({str(ready)!r}).write_text('ok')\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        agent = make_agent(tmp_path, shards=Shards(groups={"shard-1": os.getpgid(proc.pid)}))
        agent.register_message()

        ack = agent.on_remove_weights(proposal([held]))

        assert kept(ack) == {"held.gguf": f"held open by engine process {proc.pid} ({held})"}
        assert held.exists()
    finally:
        proc.kill()
        proc.wait()
