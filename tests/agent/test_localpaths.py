"""Which local paths a node hands its engines: only under the roots its agent.yaml names."""

import os

import pytest

from agentd.config import ConfigError, parse_config
from agentd.localpaths import LocalRoots, is_hub_id


@pytest.fixture
def tree(tmp_path):
    """weights/ and models/ (the roots), the agent's state/ inside models/, and elsewhere/."""
    for d in ("weights/qwen", "models/state", "models/mine", "elsewhere", "cwd"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "weights" / "qwen" / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "elsewhere" / "secret.txt").write_text("root:x:0:0")
    (tmp_path / "models" / "state" / "credential").write_text("node-secret")
    (tmp_path / "models" / "mine" / "state").mkdir()
    # a link inside a root to a file outside it, and one to a file inside
    os.symlink(tmp_path / "elsewhere" / "secret.txt", tmp_path / "weights" / "escape.gguf")
    os.symlink(tmp_path / "weights" / "qwen", tmp_path / "models" / "qwen-link")
    (tmp_path / "cwd" / "org").mkdir()
    (tmp_path / "cwd" / "org" / "present").write_text("x")
    return tmp_path


def roots(t) -> LocalRoots:
    return LocalRoots(
        roots=[t / "weights", t / "models"],
        private=[t / "models" / "state"],
        cwd=t / "cwd",
    )


@pytest.mark.parametrize(
    "text, allowed",
    [
        ("{t}/weights/qwen/model.gguf", True),
        ("{t}/weights/qwen", True),
        ("{t}/weights/not-there-yet.gguf", True),  # under a root: the engine says it is missing
        ("{t}/models/qwen-link/model.gguf", True),  # a link to another root
        ("{t}/elsewhere/secret.txt", False),
        ("/etc/passwd", False),
        ("{t}/weights/../elsewhere/secret.txt", False),  # '..' resolved first
        ("{t}/weights/escape.gguf", False),  # a link out of the root is followed
        ("{t}/models/state/credential", False),  # the agent's own files, under a root
        ("{t}/models/mine/state", True),  # not the agent's: only its own dirs are kept out
        ("Qwen/Qwen2.5-7B-Instruct", True),  # a hub id the engine fetches itself
        ("gpt2", True),
        ("org/present", False),  # a hub-form name that exists where engines start is a path
        ("../elsewhere/secret.txt", False),  # relative to where engines start
        ("a/../../elsewhere/secret.txt", False),
        ("~/.ssh/id_rsa", False),
        ("https://example.com/model.gguf", True),  # fetched into a weights dir, not local
        ("", True),
    ],
)
def test_a_local_path_is_handed_over_only_under_a_named_root(tree, text, allowed):
    problem = roots(tree).problem(text.format(t=tree), "model_path")

    assert (problem is None) is allowed, problem


def test_the_refusal_names_the_path_the_keys_and_the_fix(tree):
    problem = roots(tree).problem("/etc/passwd", "model_path")

    assert problem == (
        f"model_path /etc/passwd is not under a directory this node's agent.yaml names for "
        f"weights (weights_dirs or model_dirs: {tree}/weights, {tree}/models); add its "
        "directory to model_dirs on this node to allow it. Nothing was read"
    )
    link = roots(tree).problem(f"{tree}/weights/escape.gguf", "adapter a's source")
    assert link.startswith(f"adapter a's source {tree}/weights/escape.gguf is not under")
    assert f"(it resolves to {tree}/elsewhere/secret.txt)" in link


def test_without_roots_no_local_path_is_used_but_a_hub_id_is():
    none = LocalRoots()

    assert "weights_dirs or model_dirs: none" in none.problem("/srv/m.gguf", "model_path")
    assert none.problem("meta-llama/Llama-3.1-8B", "model_path") is None


@pytest.mark.parametrize(
    "text, hub",
    [
        ("Qwen/Qwen2.5-7B-Instruct", True),
        ("gpt2", True),
        ("a/b/c", False),
        ("a/..", False),
        ("..", False),
        ("/abs", False),
        ("org/na..me", False),
        ("-x/y", False),
        ("llama3:8b", False),
    ],
)
def test_the_hub_form(text, hub):
    assert is_hub_id(text) is hub


def test_model_dirs_in_agent_yaml_are_absolute_and_join_weights_dirs(tmp_path):
    base = {"control_plane_url": "ws://cp:8000/ws/agent/", "state_dir": str(tmp_path / "s")}
    cfg = parse_config({**base, "weights_dirs": ["/w"], "model_dirs": ["/srv/models"]})

    assert [str(p) for p in cfg.local_roots] == ["/w", "/srv/models"]
    assert cfg.private_paths == [tmp_path / "s", tmp_path / "s" / "credential"]
    with pytest.raises(ConfigError, match=r"model_dirs: 'models' is not an absolute path"):
        parse_config({**base, "model_dirs": ["models"]})
