"""The agent checks an engine version itself before pip sees it.

The finding: the control plane's check was the only one; a version such as
``0.3.36@https://evil.example/x.whl`` would have gone into pip's requirement and
the wheel URLs. The rule is agentd.protocol's, which the control plane's
WantedEngine follows too.
"""

from __future__ import annotations

import asyncio

import pytest
from django.core.exceptions import ValidationError

from agentd import install, protocol
from agentd.engineconfig import InstallConfig

CRAFTED = [
    "0.3.36@https://evil.example/llama_cpp_python.whl",
    "0.3.36 --index-url https://evil.example/simple",
    "../../evil.example/vllm",
    "0.3.36\n",
    "-e",
    "1" * 65,
]


@pytest.mark.parametrize("version", CRAFTED)
def test_a_crafted_version_fails_that_engine_before_pip_runs(tmp_path, version):
    seen = []
    installer = install.Installer(
        tmp_path / "engines", InstallConfig(pip_args=["--no-index"]), on_status=seen.append
    )

    (st,) = asyncio.run(installer.converge([install.Want("llamacpp", version)], []))

    assert st.state == "failed"
    assert st.detail.startswith(f"{version[:80]!r} is not a version (like 0.11.2")
    assert "nothing was installed" in st.detail
    assert [s.state for s in seen] == ["failed"], "no environment made, pip never ran"
    assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").iterdir())


@pytest.mark.parametrize("version", ["", "0.11.2", "0.3.36", "1.0rc1", "0.11.2+cu129", "1!2.0"])
def test_real_versions_pass(version):
    assert protocol.engine_version_problem(version) is None


@pytest.mark.parametrize("version", [v for v in CRAFTED if v != "0.3.36\n"])
def test_the_control_plane_refuses_the_same_versions(version):
    from fleet.models import WantedEngine

    with pytest.raises(ValidationError):
        WantedEngine(engine="llamacpp", version=version).clean_fields()
