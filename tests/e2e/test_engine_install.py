"""An engine the control plane wants, installed by the agent itself over real processes:
pip into the agent's own virtualenv, verified, advertised, served through the gateway;
then a file removed from that environment is found by the 10-minute re-check (the agent's
clock moved on), repaired, and the engine keeps serving (docs/engines.md)."""

import os
import re
import time
from pathlib import Path

import pytest

from agentd.install import CLOCK_FILE_ENV, MARK
from fleet.models import EngineInstall, Node
from tests.e2e.helpers import answers, apply_model, wait_serving
from tests.processes import start_agent
from tests.processes.base import ROOT
from tests.processes.stack import Agent

pytestmark = pytest.mark.django_db(transaction=True)


def pinned_llama_cpp_python() -> str:
    """The version requirements.txt pins: pip's wheel cache has the build the venv made."""
    text = (ROOT / "requirements.txt").read_text()
    return re.search(r"^llama-cpp-python\[server\]==(\S+)", text, re.M).group(1)


def installed(node_id: str, version: str):
    row = EngineInstall.objects.filter(node_id=node_id, engine="llamacpp").first()
    node = Node.objects.get(pk=node_id)
    if row and row.state == "installed" and node.engine_versions.get("llamacpp") == version:
        return row
    return None


def test_the_agent_installs_the_wanted_llamacpp_verifies_it_serves_and_repairs_it(
    stack, tiny_model, tmp_path
):
    from tests.factories import join_token

    version = pinned_llama_cpp_python()
    # given: a CPU node whose agent.yaml names no llama.cpp: it has only what it installs
    _, secret = join_token(name="e2e cpu-i", uses=1)
    agent = Agent(tmp_path / "cpu-i", "cpu-i", stack.web.ws_url, secret, engines={})
    clock = tmp_path / "agent-clock"
    agent.proc = start_agent(agent.config, **{CLOCK_FILE_ENV: str(clock)})
    stack.agents.append(agent)
    stack.wait(lambda: Node.objects.filter(pk="cpu-i", connected=True).first(), "registration")
    assert "llamacpp" not in Node.objects.get(pk="cpu-i").engine_versions

    # when: an operator wants llama.cpp through the API
    started = time.monotonic()
    stack.api("post", "engines/", json={"engine": "llamacpp", "version": version})

    # then: the agent installs it into its own environment, verifies it and advertises it
    # (On a machine whose build cache is cold, the first install compiles llama.cpp's
    # server and rpc-server: minutes on 2 cores.)
    row = stack.wait(lambda: installed("cpu-i", version), "llama.cpp installed", timeout=1200)
    took = time.monotonic() - started
    print(f"\nllama-cpp-python[server]=={version} installed and verified in {took:.1f} s")
    assert (row.version, row.variant) == (version, "cpu")
    env = agent.state_dir / "engines" / f"llamacpp-{version}-cpu"
    log = agent.proc.output()
    assert f"engine llamacpp {version} (cpu) installing: downloading" in log
    assert "engines installed and running: llamacpp" in log
    # with llama.cpp's own server and rpc-server, which multi-node replicas run
    assert "llama.cpp's llama-server and ggml-rpc-server" in log
    assert all(
        os.access(env / "bin" / tool, os.X_OK) for tool in ("llama-server", "ggml-rpc-server")
    )

    # and a replica placed there serves through the gateway, from the installed build
    apply_model(stack, tiny_model)
    (shard,) = wait_serving(stack, timeout=180)
    assert shard.node_id == "cpu-i"
    cmdline = Path(f"/proc/{agent.engines()[shard.pk]}/cmdline").read_bytes().split(b"\0")
    assert cmdline[0].decode() == str(env / "bin" / "python")

    # when: an unrelated upgrade takes a library from the environment
    (lib,) = env.glob("lib/python*/site-packages/llama_cpp/lib/libllama.so")
    lib.unlink()
    # and the agent's clock passes the 10-minute re-check
    repaired_from = len(agent.proc.output())
    clock.write_text("601")

    # then: the re-check finds it and builds a new environment beside it, verified
    new = env.with_name(env.name + "@2")

    def repaired():
        out = agent.proc.output()[repaired_from:]
        return "no longer works" in out and (new / MARK).exists()

    started = time.monotonic()
    stack.wait(repaired, "the re-check to find and repair the environment", timeout=300)
    print(f"found and repaired in {time.monotonic() - started:.1f} s")
    stack.wait(lambda: installed("cpu-i", version), "llama.cpp installed again")
    assert list(new.glob("lib/python*/site-packages/llama_cpp/lib/libllama.so"))
    # while llama.cpp stayed installed and placeable: never withdrawn for the repair
    out = agent.proc.output()[repaired_from:]
    assert f"engine llamacpp {version} (cpu) installed: repairing: downloading" in out
    assert "(cpu) installing" not in out

    # and the engine kept serving throughout, from the environment it started in
    assert answers(stack) in ("length", "stop")
    assert list(agent.engines()) == [shard.pk]
    assert (
        Path(f"/proc/{agent.engines()[shard.pk]}/cmdline")
        .read_bytes()
        .startswith(str(env / "bin" / "python").encode())
    )

    # when: the agent restarts (an upgrade)
    assert agent.proc.terminate() == 0
    agent.proc = start_agent(agent.config, **{CLOCK_FILE_ENV: str(clock)})
    stack.wait(lambda: "control plane wants engines" in agent.proc.output(), "the agent back")

    # then: it runs its verified install from the start, before the control plane's
    # wants arrive again, and re-checks it then rather than installing again
    out = agent.proc.output()
    assert out.index("engines installed and running: llamacpp") < out.index(
        "control plane wants engines"
    )
    assert "installing: downloading" not in out
    assert answers(stack) in ("length", "stop")


def test_an_operators_build_change_reaches_a_gpu_node_which_acts_on_it(stack, tmp_path):
    import subprocess
    import sys

    from tests.agent import nvml_data
    from tests.factories import join_token
    from tests.processes import subprocess_env

    def vllm():
        return EngineInstall.objects.filter(node_id="gpu-i", engine="vllm").first()

    # given: vLLM wanted, and a GPU node whose driver (R570) supports CUDA 12.8 only
    stack.api("post", "engines/", json={"engine": "vllm", "version": "0.11.2"})
    spec = nvml_data.hgx(count=1, driver_version="570.172.08", cuda_driver_version=12080)
    nvml_file = nvml_data.write(tmp_path / "nvml.json", spec)
    _, secret = join_token(name="e2e gpu-i", uses=1)
    agent = Agent(
        tmp_path / "gpu-i",
        "gpu-i",
        stack.web.ws_url,
        secret,
        engines={},
        # no network here: a cu129 wheel that is not there fails pip at once
        install={"pip_args": ["--no-index"], "vllm_cu129_wheel": str(tmp_path / "none.whl")},
    )
    agent.proc = start_agent(agent.config, nvml_file)
    stack.agents.append(agent)

    # then: auto finds no build for that driver, says why, and downloads nothing
    row = stack.wait(lambda: (r := vllm()) and r.state == "unsupported" and r, "vllm unsupported")
    assert row.detail.startswith("driver 570.172.08 supports CUDA 12.8; vLLM's builds need")
    assert not (agent.state_dir / "engines").exists()

    # when: an operator sets the build to none through the API
    started = time.monotonic()
    stack.api("post", "nodes/gpu-i/vllm-build/", json={"vllm_build": "none"})
    # then: the node hears it and reports it straight away (not at its next registration)
    stack.wait(lambda: vllm().detail.startswith("vllm build is none"), "the node to act on none")
    print(f"\nAPI build change to the node's report: {time.monotonic() - started:.2f} s")

    # when: another sets cu129 with the command
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "manage.py", "engine_build", "gpu-i", "cu129"],
        cwd=ROOT,
        env=subprocess_env(**stack.env),
        check=True,
        capture_output=True,
        timeout=60,
    )
    # then: the node tries the CUDA 12.9 build, and placement says why vLLM is not there
    row = stack.wait(lambda: (r := vllm()) and r.state == "failed" and r, "the cu129 attempt")
    print(
        f"command's build change to the node's failed install: {time.monotonic() - started:.2f} s"
    )
    assert row.variant == "cu129"
    assert row.detail.startswith("pip install exited with 1")
    assert "gpu-i: vllm 0.11.2 failed to install: pip install exited with 1" in str(
        stack.api("get", f"models/{_vllm_model(stack)}/explain/")
    )


def _vllm_model(stack) -> int:
    model = stack.api("post", "models/", json={"name": "big", "desired_replicas": 1})
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={"model": model["id"], "name": "gpu", "engine": "vllm", "model_path": "/m",
              "gpus_per_node": 1},
    )  # fmt: skip
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})
    return model["id"]
