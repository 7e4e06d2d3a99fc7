"""The real agent process against a real Daphne on the test database.

Enrolment with a join token, the node and its GPUs (the NVML double), memory
and load in the database and in `manage.py nodes`, the credential written
0600, an orderly goodbye, and a restart that comes back on the credential.
"""

import stat
import subprocess
import sys

import pytest

from tests.agent import nvml_data
from tests.factories import join_token
from tests.processes import (
    ROOT,
    start_agent,
    start_web,
    subprocess_env,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fast_daphne(transactional_db, tmp_path):
    """Daphne telling agents to heartbeat every half second, so the test is quick."""
    server = start_web(tmp_path, LLMGW_HEARTBEAT_INTERVAL_S="0.5")
    yield server
    server.stop()


def _node(node_id):
    from fleet.models import Node

    return Node.objects.filter(pk=node_id).select_related("load").first()


def _has_load(node_id):
    from fleet.models import NodeLoad

    return NodeLoad.objects.filter(node_id=node_id).first()


def test_agent_enrols_reports_and_comes_back_on_its_credential(fast_daphne, tmp_path):
    from fleet.models import GPU, JoinToken
    from fleet.services import node_logs

    # given: a join token, an HGX H100 node (the NVML double) with weights
    _, secret = join_token(uses=1)
    nvml_file = nvml_data.write(tmp_path / "nvml.json", nvml_data.hgx(nvml_data.H100))
    weights = tmp_path / "weights"
    (weights / "tiny-llama").mkdir(parents=True)
    (weights / "tiny-llama" / "model.gguf").write_bytes(b"g" * 4096)
    config = write_config(
        tmp_path,
        fast_daphne.ws_url,
        join_token=secret,
        node_id="gpu-e2e-01",
        labels={"zone": "test"},
        weights_dirs=[str(weights)],
    )

    # when: the agent starts
    agent = start_agent(config, nvml_file)
    try:
        load = wait_until(lambda: _has_load("gpu-e2e-01"), what="a heartbeat's load", proc=agent)

        # then: the node, its GPUs, memory, storage, weights and load are known
        node = _node("gpu-e2e-01")
        assert node.connected and node.state == "ready"
        assert node.agent_labels == {"zone": "test"}
        assert node.memory_total_mb and node.memory_total_mb > 0
        assert node.mgmt_addr == "127.0.0.1"
        gpus = list(GPU.objects.filter(node=node).order_by("index"))
        assert [g.name for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 8
        assert gpus[0].memory_total_mb == 81559 and gpus[0].cuda_version == "12.4"
        assert gpus[3].nvlink_peers == [0, 1, 2, 4, 5, 6, 7]
        assert {w.path: w.size_bytes for w in node.weights.all()} == {
            str(weights / "tiny-llama"): 4096
        }
        assert str(tmp_path / "state") in {s.path for s in node.storage.all()}
        assert load.cpu_count >= 1 and load.memory_available_bytes > 0

        # the credential was written for this user only, and the token is used up
        cred = tmp_path / "state" / "credential"
        assert stat.S_IMODE(cred.stat().st_mode) == 0o600
        assert cred.read_text().strip() and cred.read_text().strip() != secret
        assert JoinToken.objects.get().uses == 1

        # and an operator sees it in `manage.py nodes`
        table = subprocess.run(
            [sys.executable, "manage.py", "nodes"],
            cwd=ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        row = next(line for line in table.splitlines() if line.startswith("gpu-e2e-01"))
        _, state, cpu, mem, gpu_summary, *_ = row.split()
        assert state == "ready" and gpu_summary == "8×H100"
        assert cpu != "-" and 0 <= float(cpu) <= 100  # the load arrived and is fresh
        # this machine's MemTotal, in the GB placement counts (fleet/services/units.py)
        assert float(mem) == pytest.approx(node.memory_total_mb / 1000, abs=0.1)

        # the control plane can read the agent's own log through the socket
        reply = node_logs.request_logs("gpu-e2e-01", "agent", lines=50)
        assert reply.error == "" and reply.sources == ["agent"]
        assert any("registered node=gpu-e2e-01 gpus=8" in line for line in reply.lines)

        # a GPU running hot after registration arrives as a new problem
        spec = nvml_data.hgx(nvml_data.H100)
        spec["gpus"][5]["temperature_c"] = 93
        nvml_data.write(nvml_file, spec)
        wait_until(
            lambda: GPU.objects.get(node=node, index=5).problems,
            what="the new GPU problem",
            proc=agent,
        )
        assert GPU.objects.get(node=node, index=5).problems == ["too hot (limit 87 C)"]

        # when: SIGTERM; then: goodbye, exit 0, the node is not lost
        assert agent.terminate() == 0
        assert "said goodbye" in agent.output()
        wait_until(lambda: not _node("gpu-e2e-01").connected, what="the socket to close")
        assert _node("gpu-e2e-01").state == "ready"
    finally:
        agent.kill()

    # when: it starts again, with no join token left in its config
    first_registered = _node("gpu-e2e-01").registered_at
    config = write_config(
        tmp_path, fast_daphne.ws_url, node_id="gpu-e2e-01", weights_dirs=[str(weights)]
    )
    again = start_agent(config, nvml_file)
    try:
        # then: it comes back on its credential as the same node
        wait_until(
            lambda: (
                _node("gpu-e2e-01").registered_at > first_registered
                and _node("gpu-e2e-01").connected
            ),
            what="the node to register again",
            proc=again,
        )
        assert "enrolled" not in again.output()
    finally:
        assert again.terminate() == 0


def test_a_used_up_join_token_stops_the_agent_with_a_clear_error(fast_daphne, tmp_path):
    from fleet.models import Node

    token, secret = join_token(uses=1)
    token.uses = 1
    token.save(update_fields=["uses"])
    config = write_config(tmp_path, fast_daphne.ws_url, join_token=secret, node_id="gpu-e2e-02")

    agent = start_agent(config)
    code = agent.proc.wait(30)

    assert code == 3
    assert "refused this node's join token (HTTP 403)" in agent.output()
    assert not Node.objects.filter(pk="gpu-e2e-02").exists()


def test_a_revoked_node_stops_its_agent(fast_daphne, tmp_path):
    from fleet.services import access

    _, secret = join_token()
    config = write_config(tmp_path, fast_daphne.ws_url, join_token=secret, node_id="gpu-e2e-03")
    agent = start_agent(config)
    try:
        wait_until(lambda: _has_load("gpu-e2e-03"), what="a heartbeat", proc=agent)
        access.revoke_node(_node("gpu-e2e-03"))
        code = agent.proc.wait(30)
        assert code == 3
        assert "4010" in agent.output()
    finally:
        agent.kill()
