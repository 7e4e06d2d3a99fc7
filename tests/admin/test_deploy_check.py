"""README's production recipe passes `check --deploy`; without ALLOWED_HOSTS nothing serves."""

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def documented_production_env() -> dict[str, str]:
    """The NAME=value lines of the README's production recipe, placeholders filled in."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running in production", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    env = dict(re.findall(r"^\s*([A-Z_]+)=(\S+)", block, re.M))
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    env["METRICS_TOKEN"] = secrets.token_urlsafe(16)
    # Parsed, never connected to by `check`: this machine's own stand in for them.
    del env["DATABASE_URL"], env["REDIS_URL"]
    return env


def clean_env(tmp_path, **extra) -> dict[str, str]:
    """This process's environment without what settings.py reads, plus ``extra``."""
    read = {
        "DEBUG",
        "ALLOWED_HOSTS",
        "SECRET_KEY",
        "DATABASE_URL",
        "REDIS_URL",
        "CSRF_TRUSTED_ORIGINS",
        "METRICS_TOKEN",
        "API_DOCS_PUBLIC",
        "SECURE_COOKIES",
    }
    env = {k: v for k, v in os.environ.items() if k not in read and not k.startswith("SECURE_")}
    env["LLMGW_STATE_DIR"] = str(tmp_path)
    env.update(extra)
    return env


def run(args, env):
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_documented_production_env_passes_check_deploy(tmp_path):
    env = clean_env(tmp_path, **documented_production_env())

    result = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_without_the_https_settings_check_deploy_fails(tmp_path):
    env = clean_env(tmp_path, ALLOWED_HOSTS="llmgw.example.com", SECRET_KEY="x" * 60 + "yz")

    result = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], env)

    assert result.returncode != 0
    for warning in ("W004", "W008", "W012", "W016"):
        assert f"security.{warning}" in result.stderr


def test_any_server_importing_the_app_refuses_to_start_without_allowed_hosts(tmp_path):
    env = clean_env(tmp_path, REDIS_URL="redis://127.0.0.1:1/0")

    result = run(["-c", "import llmgw_site.asgi"], env)

    assert result.returncode != 0
    assert "ALLOWED_HOSTS is not set and DEBUG is off" in result.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_web_process_says_why_it_will_not_start_and_exits(tmp_path, workers):
    # with several workers too: none is started, so none is started again and again
    env = clean_env(tmp_path, REDIS_URL="redis://127.0.0.1:1/0")

    result = run(["-m", "llmgw_site.serve", "--port", "1", "--workers", workers], env)

    assert result.returncode == 2
    assert "llmgw: not starting: ALLOWED_HOSTS is not set and DEBUG is off" in result.stderr
