"""Every YAML file we read is read with bounded work (agentd.safeyaml): agent.yaml,
llmgw's cli.yaml and catalog files refuse anchors and aliases, text past 1 MiB and
nesting past 64 levels, each naming the problem. (The catalog through the API:
tests/api/test_yaml_bounds.py.)"""

from __future__ import annotations

import io

import pytest
import yaml

from agentd import ctl, safeyaml
from agentd.config import ConfigError, load_config
from agentd.ctl import exits

ALIASED = "control_plane_url: &u http://cp:8000\nnode_id: *u\n"


def test_agent_yaml_with_an_alias_is_refused_naming_it(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(ALIASED)

    with pytest.raises(ConfigError, match=r"anchors and aliases are not allowed \(&u\)"):
        load_config(path)


def test_llmgw_cli_yaml_with_an_alias_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMGW_URL", raising=False)
    monkeypatch.delenv("LLMGW_API_KEY", raising=False)
    config = tmp_path / "cli.yaml"
    config.write_text("url: &u http://cp:8000\napi_key: *u\n")
    config.chmod(0o600)
    err = io.StringIO()

    status = ctl.main(["--config", str(config), "nodes"], out=io.StringIO(), err=err)

    assert status == exits.EXIT_USAGE
    assert "anchors and aliases are not allowed" in err.getvalue()


@pytest.mark.parametrize(
    "text, problem",
    [
        ("a: *nowhere\n", "anchors and aliases are not allowed (*nowhere)"),
        ("a: !!str &x b\n", "anchors and aliases are not allowed (&x)"),
        ("a:\n" + "".join("  " * i + "- \n" for i in range(1, 80)), "nested more than 64"),
        ("a: " + "x" * safeyaml.MAX_CHARS + "\n", "is more than the 1,048,576 allowed"),
        ("[" + "1," * safeyaml.MAX_NODES + "1]", "more than 100,000 values"),
    ],
    ids=["alias", "anchor", "deep block nesting", "too long", "too many values"],
)
def test_refusals_name_the_problem(text, problem):
    with pytest.raises(yaml.YAMLError) as caught:
        safeyaml.load(text)

    assert problem in str(caught.value)


def test_what_safe_load_reads_otherwise_is_read_the_same():
    text = "models:\n  - {name: a, replicas: 2, on: yes, at: 2024-01-01, x: null}\n"

    assert safeyaml.load(text) == yaml.safe_load(text)
    assert safeyaml.load("") is None
