"""Behaviours the seed promised that had code but no test: what an operator reads in the
logs, what a heartbeat carries, what a node advertises and when it installs."""

import asyncio
import logging
import os

import pytest

from agentd import agent as agent_module
from agentd import install, nvml, protocol, provisioning
from agentd.supervised import SupervisedShards
from agentd.supervisor import Supervisor
from fleet.services import engines, inventory
from tests.agent.test_agent_engines import Versions, _script, provision, verified_llamacpp
from tests.agent.test_agent_messages import RecordingShards, make_agent
from tests.factories import register_msg


@pytest.fixture
def cpu_node(monkeypatch):
    monkeypatch.delenv(nvml.FAKE_ENV, raising=False)  # no NVIDIA driver: a CPU node


def messages(caplog, logger: str) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == logger]


def llama_server(path, version: str | None):
    """A llama-server that answers ``--version`` (None: with no version line); replaced
    whole, never rewritten in place (a script being run cannot be written to)."""
    says = f"echo 'version: {version}'" if version else "exit 0"
    new = _script(path.with_name(path.name + ".new"), f"#!/bin/sh\n{says}\n")
    os.replace(new, path)
    return path


# ---- 1. the control plane logs each registration ---------------------------------------


@pytest.mark.django_db
def test_a_registration_is_logged_with_the_nodes_gpus_fabrics_and_running_shards(caplog):
    running = [
        {"shard_id": f"shard-{i}", "state": "running", "model": "m", "profile": "p"}
        for i in range(2)
    ]
    msg = register_msg("gpu-seed", running_shards=running, agent_version="0.4.2")

    with caplog.at_level(logging.INFO, logger="fleet.services.inventory"):
        inventory.register_node(protocol.parse_agent_message(msg))

    assert ("INFO", "agent registered node=gpu-seed gpus=8 fabrics=['ib0'] running_shards=2 "
            "agent_version=0.4.2") in messages(caplog, "fleet.services.inventory")  # fmt: skip


# ---- 2. provision lists the wanted engines by name ---------------------------------------


def test_provision_lists_two_wanted_engines_sorted_by_name_with_the_nodes_vllm_build():
    msg = engines.provision_for(
        "gpu-seed", engines={"vllm": "0.11.2", "llamacpp": "0.3.36"}, build="cu129"
    )
    assert [(e.engine, e.version, e.variant) for e in msg.engines] == [
        ("llamacpp", "0.3.36", ""),
        ("vllm", "0.11.2", "cu129"),
    ]


# ---- 3. a removal rescans the weights at once --------------------------------------------


def test_the_heartbeat_after_a_weights_removal_reports_the_weights_left(tmp_path, cpu_node):
    w = tmp_path / "weights"
    w.mkdir()
    (w / "old.gguf").write_bytes(b"o" * 10)
    (w / "kept.gguf").write_bytes(b"k" * 20)
    agent = make_agent(tmp_path)
    agent.register_message()  # the weights were reported; the next rescan is a minute away
    assert agent.weights_rescan_s == 60.0
    assert not agent.heartbeat_message().weights_changed

    removal = protocol.RemoveWeights(
        type="remove_weights", paths=[str(w / "old.gguf")], request_id="r1"
    )
    asyncio.run(agent.handle(removal))

    hb = agent.heartbeat_message()
    assert hb.weights_changed
    assert [(os.path.basename(x.path), x.size_bytes) for x in hb.weights] == [("kept.gguf", 20)]


# ---- 4 and 9. the engines agent.yaml names, at start and when they change ----------------


def test_the_agent_logs_the_configured_engines_it_found_at_start_and_when_they_change(
    tmp_path, caplog, cpu_node
):
    server = llama_server(tmp_path / "llama-server", "4567 (abc1234)")
    sup = Supervisor(
        tmp_path / "sup", port_range=(30000, 30009), binaries={"llamacpp": str(server)}
    )
    agent = make_agent(tmp_path, shards=SupervisedShards(sup))
    log = "agentd.supervisor"

    async def scenario():
        await agent.start()
        try:
            # 4: the start-up probe, said once
            assert [m for m in messages(caplog, log) if "engines named" in m[1]] == [
                ("INFO", "engines named in the configuration: llamacpp 4567 (abc1234)")
            ]
            caplog.clear()
            await agent.shards.refresh()  # the same answer: nothing to say
            assert messages(caplog, log) == []
            # 9: an operator upgraded it, then broke it
            llama_server(server, "4600 (def5678)")
            await agent.shards.refresh()
            llama_server(server, None)
            await agent.shards.refresh()
            assert messages(caplog, log) == [
                ("INFO", "engines named in the configuration changed: llamacpp 4600 (def5678)"),
                ("INFO", "engines named in the configuration changed: none answers"),
            ]
        finally:
            await agent.close()

    with caplog.at_level(logging.INFO, logger=log):
        asyncio.run(scenario())


# ---- 5. an installed build is used before the configured one ----------------------------


def test_an_installed_engine_is_advertised_and_run_before_the_configured_one(tmp_path, cpu_node):
    shards = Versions({"llamacpp": "4567 (abc1234)"})  # the configured one answers
    agent = make_agent(tmp_path, shards=shards)
    assert agent.installs.engine_versions() == {"llamacpp": "4567 (abc1234)"}

    # a verified install of llama.cpp (counted as at a restart: no pip here)
    env = verified_llamacpp(agent.installs.installer)
    agent.installs.installer.restore([install.Want("llamacpp", "0.3.36")], [])
    agent.installs.use_installed()

    assert agent.installs.engine_versions() == {"llamacpp": "0.3.36"}
    assert shards.installed == {"llamacpp": str(env / "bin" / "python")}


def test_the_supervisor_runs_an_installed_binary_before_the_one_agent_yaml_names(tmp_path):
    configured = llama_server(tmp_path / "configured", "4567 (abc1234)")
    installed = llama_server(tmp_path / "installed", "9999 (inst000)")

    async def versions():
        sup = Supervisor(tmp_path / "sup", port_range=(30000, 30009),
                         binaries={"llamacpp": str(configured)})  # fmt: skip
        await sup.start()
        try:
            seen = [sup.engine_versions()]
            sup.use_installed("llamacpp", str(installed))
            seen.append(await sup.probe_engines())
            sup.use_installed("llamacpp", None)  # the install is gone: agent.yaml's again
            seen.append(await sup.probe_engines())
            return seen
        finally:
            await sup.close()

    assert asyncio.run(versions()) == [
        {"llamacpp": "4567 (abc1234)"},
        {"llamacpp": "9999 (inst000)"},
        {"llamacpp": "4567 (abc1234)"},
    ]


# ---- 6. failed and unsupported installs are warnings -------------------------------------


def test_failed_and_unsupported_installs_are_logged_as_warnings(tmp_path, caplog, cpu_node):
    agent = make_agent(tmp_path)
    agent.installs.on_provision(
        provision(("vllm", "0.11.2", "cu13"), ("llamacpp", "latest please", ""))
    )

    with caplog.at_level(logging.INFO, logger="agentd.agent"):
        assert asyncio.run(agent.installs.install_pass())  # a failure
        progress = install.Status("sglang", "0.5.5", "cuda", install.INSTALLING, "downloading")
        agent.installs.log_status(progress)

    logged = {m for m in messages(caplog, "agentd.agent") if m[1].startswith("engine ")}
    unsupported = (
        "engine vllm 0.11.2 (cu13) unsupported: no NVIDIA GPU on this node: "
        "vLLM's cu13 build needs one"
    )
    failed = (
        "engine llamacpp latest please () failed: 'latest please' is not a version (like 0.11.2 "
        "or 0.3.36: letters, digits and . + ! _ -, at most "
        f"{protocol.ENGINE_VERSION_MAX} characters); nothing was installed"
    )
    assert logged == {
        ("WARNING", unsupported),
        ("WARNING", failed),
        ("INFO", "engine sglang 0.5.5 (cuda) installing: downloading"),
    }
    assert agent.installs.installer.downloads == 0


# ---- 7. an unchanged provision status is said once ---------------------------------------


def test_a_provision_status_goes_in_one_heartbeat_and_not_again_until_it_changes(
    tmp_path, cpu_node
):
    agent = make_agent(tmp_path)
    agent.installs.on_provision(provision(("vllm", "0.11.2", "cu13")))
    reg = agent.register_message()
    assert [(p.engine, p.state) for p in reg.provision] == [("vllm", "installing")]
    hb = agent.heartbeat_message()
    assert not hb.provision_changed and hb.provision == []  # the register said it

    asyncio.run(agent.installs.install_pass())
    hb = agent.heartbeat_message()
    assert hb.provision_changed
    assert [(p.engine, p.state) for p in hb.provision] == [("vllm", "unsupported")]

    asyncio.run(agent.installs.install_pass())  # the same outcome again
    hb = agent.heartbeat_message()
    assert not hb.provision_changed and hb.provision == []


# ---- 8. the re-probe each minute, and the bare heartbeat ---------------------------------


class Probed(RecordingShards):
    def __init__(self):
        super().__init__()
        self.probes = 0

    async def refresh(self):
        self.probes += 1
        if self.probes == 1:
            raise RuntimeError("the probe blew up")


def test_the_configured_engines_are_probed_again_every_minute_even_after_a_failure(
    tmp_path, caplog, monkeypatch
):
    shards = Probed()
    agent = make_agent(tmp_path, shards=shards)
    real_sleep, slept = asyncio.sleep, []

    async def sleep(delay, result=None):  # a minute passes at once, and is noted
        slept.append(delay)
        await real_sleep(0)
        return result

    async def scenario():
        monkeypatch.setattr(asyncio, "sleep", sleep)
        loop = asyncio.ensure_future(agent._reprobe_loop())
        try:
            async with asyncio.timeout(5):
                while shards.probes < 3:
                    await real_sleep(0)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)

    with caplog.at_level(logging.INFO, logger="agentd.agent"):
        asyncio.run(scenario())
    assert agent_module.ENGINE_REPROBE_S == 60.0
    assert slept[:3] == [60.0, 60.0, 60.0] and set(slept) == {60.0}
    assert ("ERROR", "probing the engines failed") in messages(caplog, "agentd.agent")


def test_a_bare_heartbeat_carries_only_its_sequence_and_desired_version(tmp_path, cpu_node):
    agent = make_agent(tmp_path)
    agent.desired_version = 7
    agent.register_message()
    assert agent.heartbeat_message().seq == 1

    bare = protocol.parse_agent_message(protocol.dump(agent.bare_heartbeat()))

    assert bare.model_dump(exclude_defaults=True) == {
        "type": "heartbeat",
        "seq": 2,
        "desired_version": 7,
    }


# ---- 10. the install loop waits for the control plane ------------------------------------


def test_the_install_loop_runs_no_pass_until_the_control_plane_says_which_engines(
    tmp_path, monkeypatch, cpu_node
):
    monkeypatch.setattr(provisioning, "INSTALL_TICK_S", 0.01)
    agent = make_agent(tmp_path)
    agent.installs.clock = lambda: 1e9  # any pass would be long due by the clock
    passes = []
    install_pass = agent.installs.install_pass

    async def counted():
        passes.append(list(agent.installs.wants or []))
        return await install_pass()

    agent.installs.install_pass = counted

    async def scenario():
        loop = asyncio.ensure_future(agent.installs.loop())
        try:
            agent.installs.kick.set()  # woken, but told nothing yet
            await asyncio.sleep(0.3)  # some thirty ticks
            assert passes == [] and agent.installs.provision() == []
            agent.installs.on_provision(provision(("vllm", "0.11.2", "auto")))
            async with asyncio.timeout(5):
                while not passes:
                    await asyncio.sleep(0.01)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)

    asyncio.run(scenario())
    assert [[w.engine for w in p] for p in passes] == [["vllm"]]
    assert agent.installs.installer.downloads == 0


# ---- 11. a reconnect retries a failed install at once --------------------------------------


def test_the_same_provision_again_retries_a_failed_install_but_not_a_good_one(tmp_path, cpu_node):
    agent = make_agent(tmp_path)
    wants = provision(("llamacpp", "0.3.36", ""))
    agent.installs.on_provision(wants)
    agent.installs.kick.clear()  # the pass it asked for ran
    agent.installs.installer.statuses["llamacpp"] = install.Status(
        "llamacpp", "0.3.36", "cpu", install.INSTALLED
    )

    # a reconnect: the same list, with everything installed, waits for the re-check
    agent.installs.on_provision(wants)
    assert not agent.installs.kick.is_set()

    # the same list while an install failed (backing off): a pass now
    agent.installs.installer.statuses["llamacpp"] = install.Status(
        "llamacpp", "0.3.36", "cpu", install.FAILED, "pip install exited with 1"
    )
    agent.installs.on_provision(wants)
    assert agent.installs.kick.is_set()
