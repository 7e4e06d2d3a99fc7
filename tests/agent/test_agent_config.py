"""agent.yaml validation: bad input names the field and the problem and exits non-zero."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentd.config import ConfigError, load_config, parse_config, sanitise_node_id

ROOT = Path(__file__).resolve().parents[2]
URL = "ws://cp.example:8000/ws/agent/"


def test_minimal_config_gets_the_documented_defaults(tmp_path):
    cfg = parse_config({"control_plane_url": URL, "join_token": "jt_abc"})
    assert cfg.heartbeat_interval_s == 10
    assert cfg.engine_port_range == (30000, 30999)
    assert cfg.credential_path == Path("/var/lib/llmgw-agent/credential")
    assert cfg.node_id == sanitise_node_id(os.uname().nodename)


def test_the_example_config_is_valid():
    cfg = load_config(ROOT / "docs" / "agent.example.yaml")
    assert cfg.control_plane_url.endswith("/ws/agent/")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"control_plane_url": "http://cp/ws/agent/"}, "control_plane_url: must start with ws://"),
        ({"control_plane_url": "ws://cp/agent"}, "control_plane_url: the path must be /ws/agent/"),
        ({"control_plane_url": "ws:///ws/agent/"}, "control_plane_url: names no host"),
        (
            {"control_plane_urls": ["ws://cp-2/ws/agent/", "ws://cp-3/agent"]},
            "control_plane_urls: [1]: the path must be /ws/agent/",
        ),
        (
            {"control_plane_urls": ["wss://cp-2/ws/agent/"]},
            "every URL must use the scheme of control_plane_url (ws://)",
        ),
        ({"control_plane_urls": [URL]}, "control_plane_urls: names a URL twice"),
        ({"node_id": "-bad"}, "node_id: '-bad' is not a node id"),
        ({"node_id": "a" * 64}, "node_id:"),
        ({"heartbeat_interval_s": 0}, "heartbeat_interval_s: Input should be greater than 0"),
        (
            {"engine_port_range": [31000, 30000]},
            "engine_port_range: port range 31000-30000 must lie within 1024-65535, low first",
        ),
        (
            {"engine_port_range": [80, 90]},
            "engine_port_range: port range 80-90 must lie within 1024-65535, low first",
        ),
        (
            {"engines": {"binaries": {"vllmm": "/opt/vllm"}}},
            "engines.binaries: unknown engine 'vllmm' (known: fake, llamacpp, sglang, vllm)",
        ),
        ({"engines": {"disabled": ["tgi"]}}, "unknown engine 'tgi'"),
        ({"heartbeat_intervall_s": 5}, "heartbeat_intervall_s: unknown field (a typo?)"),
        ({"labels": "gpu=yes"}, "labels: Input should be a valid dictionary"),
        ({"join_token": "  "}, "join_token: is empty"),
        ({"tls_ca_file": "/etc/ca.pem"}, "tls_ca_file: only means something with a wss://"),
        ({"tls_cert_file": "/etc/node.pem"}, "tls_cert_file: only means something with a wss://"),
        (
            {"control_plane_url": "wss://cp/ws/agent/", "tls_key_file": "/etc/node.key"},
            "tls_key_file: names the key of tls_cert_file, which is not set",
        ),
    ],
)
def test_invalid_fields_are_named(fields, message):
    data = {"control_plane_url": URL, "join_token": "jt_abc", **fields}
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert message in str(err.value)


def test_missing_url_is_named():
    with pytest.raises(ConfigError, match="control_plane_url: Field required"):
        parse_config({"join_token": "x"})


def test_not_yaml_and_not_a_mapping(tmp_path):
    bad = tmp_path / "agent.yaml"
    bad.write_text("control_plane_url: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(bad)


def test_no_token_and_no_credential_yet(tmp_path):
    cfg = parse_config({"control_plane_url": URL, "state_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="join_token: needed until the node has a credential"):
        cfg.bearer()
    (tmp_path / "credential").write_text("nc_secret\n")
    assert cfg.bearer() == "nc_secret"  # the credential wins once there is one


@pytest.mark.parametrize(
    "hostname, node_id",
    [
        ("gpu-07.dc1.example.com", "gpu-07.dc1.example.com"),
        ("_my host!", "my-host-"),
        ("x" * 80, "x" * 63),
        ("___", "node"),
    ],
)
def test_hostnames_become_valid_node_ids(hostname, node_id):
    assert sanitise_node_id(hostname) == node_id


def test_cli_exits_non_zero_naming_the_field(tmp_path):
    bad = tmp_path / "agent.yaml"
    bad.write_text(f"control_plane_url: {URL}\njoin_token: t\nheartbeat_interval_s: soon\n")
    run = subprocess.run(
        [sys.executable, "-m", "agentd", "--config", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "heartbeat_interval_s: Input should be a valid number" in run.stderr


def test_engines_may_allow_loader_variables_and_nothing_else():
    cfg = parse_config(
        {"control_plane_url": URL, "engines": {"allow_env": ["LD_LIBRARY_PATH", "PYTHONPATH"]}}
    )
    assert cfg.engines.allow_env == ["LD_LIBRARY_PATH", "PYTHONPATH"]
    assert parse_config({"control_plane_url": URL}).engines.allow_env == []

    with pytest.raises(ConfigError, match="engines.allow_env: 'OMP_NUM_THREADS' is not"):
        parse_config({"control_plane_url": URL, "engines": {"allow_env": ["OMP_NUM_THREADS"]}})


def test_more_web_processes_are_tried_after_the_first_in_their_order():
    cfg = parse_config(
        {
            "control_plane_url": URL,
            "control_plane_urls": ["ws://cp-2/ws/agent/", "ws://cp-3/ws/agent/"],
        }
    )
    assert cfg.urls == [URL, "ws://cp-2/ws/agent/", "ws://cp-3/ws/agent/"]
    assert parse_config({"control_plane_url": URL}).urls == [URL]
