"""vLLM's CUDA 12.9 wheel, read from the release's own list of assets (docs/engines.md).

The asset names below are vLLM's own: v0.29.0's whole list, and the cu129 wheels of
v0.21.0 (manylinux_2_34) and of the 0.11 line (manylinux1). The platform suffix
changed between releases and differs between variants of one release, which is why
the agent reads the list instead of filling in a pattern.
"""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from packaging.tags import Tag, cpython_tags

from agentd import install, sources
from agentd.engineconfig import InstallConfig
from tests.agent.test_agent_engines import gpus_with

V0290 = [
    "vllm-0.29.0+cpu-cp312-cp312-macosx_11_0_arm64.whl",
    "vllm-0.29.0+cpu-cp38-abi3-manylinux_2_34_aarch64.whl",
    "vllm-0.29.0+cpu-cp38-abi3-manylinux_2_34_x86_64.whl",
    "vllm-0.29.0+cu129-cp38-abi3-manylinux_2_28_aarch64.whl",
    "vllm-0.29.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.29.0+xpu-cp38-abi3-manylinux_2_34_x86_64.whl",
    "vllm-0.29.0-cp38-abi3-manylinux_2_28_aarch64.whl",
    "vllm-0.29.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "vllm-0.29.0.tar.gz",
]
V0210 = [
    "vllm-0.21.0+cu129-cp38-abi3-manylinux_2_34_aarch64.whl",
    "vllm-0.21.0+cu129-cp38-abi3-manylinux_2_34_x86_64.whl",
    "vllm-0.21.0-cp38-abi3-manylinux_2_34_x86_64.whl",
]
V0112 = [
    "vllm-0.11.2+cu129-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.11.2+cu129-cp38-abi3-manylinux2014_aarch64.whl",
    "vllm-0.11.2+cu130-cp38-abi3-manylinux1_x86_64.whl",
    "vllm-0.11.2-cp38-abi3-manylinux1_x86_64.whl",
]


def machine(arch: str, glibc_minor: int) -> list[Tag]:
    """The tags pip accepts on a Linux machine with this glibc, CPython 3.11, most specific
    first (the manylinux rules: PEP 600, and the legacy names' glibc)."""
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    platforms = []
    for minor in range(glibc_minor, 4, -1):
        platforms.append(f"manylinux_2_{minor}_{arch}")
        if minor in legacy:
            platforms.append(f"{legacy[minor]}_{arch}")
    return list(cpython_tags((3, 11), platforms=[*platforms, f"linux_{arch}"]))


@pytest.mark.parametrize(
    "names, version, arch, glibc, wheel",
    [
        (V0290, "0.29.0", "x86_64", 35, "vllm-0.29.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl"),
        (V0290, "0.29.0", "aarch64", 39, "vllm-0.29.0+cu129-cp38-abi3-manylinux_2_28_aarch64.whl"),
        (V0290, "0.29.0", "x86_64", 27, None),  # glibc too old for manylinux_2_28
        (V0210, "0.21.0", "x86_64", 35, "vllm-0.21.0+cu129-cp38-abi3-manylinux_2_34_x86_64.whl"),
        (V0210, "0.21.0", "x86_64", 31, None),
        (V0112, "0.11.2", "x86_64", 31, "vllm-0.11.2+cu129-cp38-abi3-manylinux1_x86_64.whl"),
        (V0112, "0.11.2", "aarch64", 31, "vllm-0.11.2+cu129-cp38-abi3-manylinux2014_aarch64.whl"),
        (V0112, "0.11.1", "x86_64", 31, None),  # another version's list
    ],
)
def test_the_cu129_wheel_is_the_one_the_release_lists_for_the_machine(
    names, version, arch, glibc, wheel
):
    assert sources.pick_wheel(names, "vllm", version, "cu129", machine(arch, glibc)) == wheel


def test_of_two_wheels_that_fit_the_more_specific_platform_wins():
    names = [
        "vllm-0.30.0+cu129-cp38-abi3-manylinux1_x86_64.whl",
        "vllm-0.30.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl",
    ]
    assert sources.pick_wheel(names, "vllm", "0.30.0", "cu129", machine("x86_64", 35)) == names[1]


class Releases:
    """GitHub's release API as far as the agent reads it: /tags/vX gives the assets, each
    with its name and browser_download_url (here, URLs on this server that 404)."""

    def __init__(self, lists: dict[str, list[str]]):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.asked.append(self.path)
                tag = self.path.rsplit("/", 1)[-1]
                if tag not in lists:
                    self.send_error(404, "Not Found")
                    return
                assets = [
                    {"name": n, "browser_download_url": f"{outer.url}/download/{tag}/{n}"}
                    for n in lists[tag]
                ]
                body = json.dumps({"tag_name": tag, "assets": assets}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.asked: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def releases():
    # this machine's own arch and glibc (Linux, glibc >= 2.34 here) pick the wheel
    srv = Releases({"v0.29.0": V0290, "v0.9.0": ["vllm-0.9.0-cp38-abi3-manylinux1_x86_64.whl"]})
    yield srv
    srv.close()


def plan_for(releases, version: str) -> sources.Plan:
    cfg = InstallConfig(vllm_release=f"{releases.url}/repos/vllm/releases/tags/v{{version}}")
    return sources.pip_plan("vllm", version, "cu129", cfg)


def test_the_wheel_url_comes_from_the_release_the_plan_names(releases):
    import platform

    url = sources.release_wheel(plan_for(releases, "0.29.0"))

    arch = platform.machine()
    assert url == (
        f"{releases.url}/download/v0.29.0/vllm-0.29.0+cu129-cp38-abi3-manylinux_2_28_{arch}.whl"
    )
    assert releases.asked == ["/repos/vllm/releases/tags/v0.29.0"]


def test_a_release_without_a_fitting_wheel_or_with_no_page_is_a_clear_error(releases):
    with pytest.raises(sources.PlanError) as err:
        sources.release_wheel(plan_for(releases, "0.9.0"))
    assert "lists no cu129 wheel of vllm 0.9.0 this machine can install" in str(err.value)
    assert "its wheels: vllm-0.9.0-cp38-abi3-manylinux1_x86_64.whl" in str(err.value)

    with pytest.raises(sources.PlanError) as err:
        sources.release_wheel(plan_for(releases, "0.28.9"))
    assert "tags/v0.28.9: the server answered 404" in str(err.value)
    assert "install.vllm_cu129_wheel" in str(err.value)


@pytest.mark.live
def test_the_install_hands_pip_the_wheel_the_release_lists(tmp_path, monkeypatch, releases):
    gpus = gpus_with(tmp_path, monkeypatch, "575.57.08", 12090)  # auto: cu129
    cfg = InstallConfig(
        pip_args=["--no-index"],
        vllm_release=f"{releases.url}/repos/vllm/releases/tags/v{{version}}",
    )
    seen = []
    installer = install.Installer(tmp_path / "engines", cfg, on_status=seen.append)

    (st,) = asyncio.run(installer.converge([install.Want("vllm", "0.29.0")], gpus))

    # pip was given the listed wheel's URL, which 404s on this server
    assert (st.state, st.variant) == ("failed", "cu129")
    assert "/download/v0.29.0/vllm-0.29.0+cu129-cp38-abi3-manylinux_2_28_" in st.detail
    assert ("installing", "reading the release's wheels") in [(s.state, s.detail) for s in seen]

    (st,) = asyncio.run(installer.converge([install.Want("vllm", "0.9.0")], gpus))
    assert st.state == "failed"
    assert "lists no cu129 wheel of vllm 0.9.0" in st.detail
