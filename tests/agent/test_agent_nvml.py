"""GPU discovery against the NVML test double, and for real on this GPU-less machine."""

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from agentd import nvml
from agentd.nvml import NVML, Checks
from agentd.nvml_double import FakeNVML
from tests.agent import nvml_data

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Point agentd/nvml.py at a spec file; returns a function that (re)writes it."""
    path = tmp_path / "nvml.json"

    def use(spec: dict) -> Path:
        nvml_data.write(path, spec)
        # A fresh mtime even within the filesystem's timestamp granularity.
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        return path

    monkeypatch.setenv(nvml.FAKE_ENV, str(path))
    return use


def test_hgx_h100_node_reports_eight_gpus_with_their_facts(fake):
    fake(nvml_data.hgx(nvml_data.H100))
    session = NVML.open()
    gpus = session.gpus(Checks())

    assert [g.index for g in gpus] == list(range(8))
    g0 = gpus[0]
    assert g0.name == "NVIDIA H100 80GB HBM3"
    assert g0.memory_total_mb == 81559
    assert g0.memory_used_mb == 535
    assert g0.uuid.startswith("GPU-5f1c8a2e-") and len(g0.uuid) == 40
    assert g0.pci_bus_id == "00000000:18:00.0"
    assert g0.compute_capability == "9.0"
    assert g0.driver_version == "550.90.07"
    assert g0.cuda_version == "12.4"
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert g0.temperature_c == 31
    assert g0.ecc_errors == 0 and g0.problems == []
    # Every link ends at an NVSwitch: all eight reach each other.
    assert all(g.nvlink_peers == [j for j in range(8) if j != g.index] for g in gpus)


def test_h200_memory(fake):
    fake(nvml_data.hgx(nvml_data.H200, count=4))
    gpus = NVML.open().gpus(Checks())
    assert {(g.name, g.memory_total_mb) for g in gpus} == {("NVIDIA H200", 143771)}


def test_direct_nvlink_peers_map_the_remote_bus_id_back_to_an_index(fake):
    fake(nvml_data.h100_nvl_pairs())
    gpus = NVML.open().gpus(Checks())
    assert [g.nvlink_peers for g in gpus] == [[1], [0], [3], [2]]


def test_pcie_only_gpus_have_no_peers(fake):
    spec = nvml_data.hgx(count=2)
    for g in spec["gpus"]:
        g["nvlinks"] = None  # NVLink not supported on this board
    fake(spec)
    assert [g.nvlink_peers for g in NVML.open().gpus(Checks())] == [[], []]


@pytest.mark.parametrize(
    "overrides, problem",
    [
        ({"ecc_volatile_uncorrected": 3}, "uncorrected ECC errors over 0"),
        ({"remapped_rows": [2, 1, 1, 0]}, "row remapping pending: reset the GPU"),
        ({"remapped_rows": [0, 9, 0, 1]}, "row remapping failed: the GPU needs service"),
        ({"temperature_c": 91}, "too hot (limit 87 C)"),
        (
            {"remapped_rows": None, "retired_pages_pending": 1, "retired_pages": {"sbe": 2}},
            "retired pages pending: reset the GPU",
        ),
        (
            {"remapped_rows": None, "retired_pages_pending": 0, "retired_pages": {"dbe": 61}},
            "60 or more retired pages: the GPU needs service",
        ),
        ({"lost": True}, "unreadable through NVML: GPU is lost"),
    ],
)
def test_gpu_problems(fake, overrides, problem):
    spec = nvml_data.hgx(count=2)
    spec["gpus"][1].update(overrides)
    fake(spec)
    gpus = NVML.open().gpus(Checks())
    assert gpus[0].problems == []
    assert gpus[1].problems == [problem]


def test_ecc_threshold_and_driver_slowdown_limit_are_respected(fake):
    spec = nvml_data.hgx(count=2)
    spec["gpus"][0].update(ecc_volatile_uncorrected=2)
    spec["gpus"][1].update(temperature_c=80, slowdown_c=79)  # the driver throttles first
    fake(spec)
    gpus = NVML.open().gpus(Checks(ecc_error_threshold=5, max_temperature_c=87))
    assert gpus[0].problems == [] and gpus[0].ecc_errors == 2
    assert gpus[1].problems == ["too hot (limit 79 C)"]


def test_heartbeat_readings_follow_the_driver(fake):
    spec = nvml_data.hgx(count=2)
    fake(spec)
    session = NVML.open()
    assert session.memory_used_mb() == [535, 535]
    spec["gpus"][1]["memory_used_bytes"] = 70000 * 2**20
    spec["gpus"][1]["ecc_volatile_uncorrected"] = 1
    fake(spec)
    assert session.memory_used_mb() == [535, 70000]
    assert session.problems(Checks()) == {0: [], 1: ["uncorrected ECC errors over 0"]}


def test_numa_node_falls_back_to_sysfs_on_older_drivers(fake, tmp_path):
    spec = nvml_data.hgx(count=1)
    spec["gpus"][0]["numa_node"] = None
    fake(spec)
    dev = tmp_path / "pci" / "0000:18:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    assert NVML.open(pci_root=tmp_path / "pci").gpus(Checks())[0].numa_node == 1
    (dev / "numa_node").write_text("-1\n")  # the kernel's "no NUMA affinity"
    assert NVML.open(pci_root=tmp_path / "pci").gpus(Checks())[0].numa_node is None


def test_missing_driver_in_the_double_is_a_cpu_node(fake):
    fake({"library": "missing"})
    assert NVML.open() is None


def test_real_pynvml_without_libnvidia_ml_is_a_cpu_node(monkeypatch):
    # This machine has no NVIDIA driver: the real library path, no double.
    monkeypatch.delenv(nvml.FAKE_ENV, raising=False)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    assert NVML.open() is None


def test_discover_on_this_machine_prints_a_cpu_node():
    env = {k: v for k, v in os.environ.items() if k != nvml.FAKE_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "agentd", "discover", "--no-config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    inv = json.loads(out.stdout)
    assert inv["type"] == "register" and inv["running_shards"] == []
    assert inv["gpus"] == []
    assert inv["memory_total_mb"] > 0


def _nvml_calls() -> set[str]:
    tree = ast.parse(Path(nvml.__file__).read_text())
    names = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr.startswith("nvml")
    } - {"nvml"}
    # pynvml's event types and clock reasons are spelled like functions but are numbers.
    return {n for n in names if not isinstance(getattr(pynvml, n, None), int)}


def test_the_double_implements_every_call_with_pynvmls_signature():
    calls = _nvml_calls()
    assert "nvmlDeviceGetNvLinkRemotePciInfo" in calls  # the scan sees attribute calls
    for name in calls:
        real = getattr(pynvml, name)
        double = getattr(FakeNVML, name)
        real_params = list(inspect.signature(real).parameters)
        double_params = list(inspect.signature(double).parameters)[1:]  # less self
        assert double_params == real_params, name


def test_the_double_fails_like_pynvml(fake):
    fake(nvml_data.hgx(count=1))
    lib = FakeNVML(Path(os.environ[nvml.FAKE_ENV]))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        lib.nvmlDeviceGetCount()
    lib.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetHandleByIndex(1)
    h = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        lib.nvmlDeviceGetNvLinkState(h, nvml_data.NVLINKS_PER_H100)  # past the last link
    with pytest.raises(pynvml.NVMLError_NotSupported):
        lib.nvmlDeviceGetRetiredPagesPendingStatus(h)
    assert isinstance(lib.nvmlDeviceGetPciInfo(h), pynvml.nvmlPciInfo_t)


def test_processes_hold_memory_as_the_driver_lists_them(fake, tmp_path):
    """Someone else's job from the file, and a live engine's claim; a dead one's is freed."""
    spec = nvml_data.hgx(count=2)
    uuid0, uuid1 = spec["gpus"][0]["uuid"], spec["gpus"][1]["uuid"]
    spec["processes"] = [{"pid": 4242, "gpu": 1, "used_bytes": 12 * 2**30}]
    path = fake(spec)
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        from agentd.gpuclaims import claim

        claim(path, engine.pid, {uuid0: 30 * 2**30, uuid1: 2 * 2**30})
        claim(path, gone.pid, {uuid0: 40 * 2**30})  # exited: the driver freed it
        session = NVML.open()
        assert session.process_memory() == {
            engine.pid: {uuid0: 30 * 2**30, uuid1: 2 * 2**30},
            4242: {uuid1: 12 * 2**30},
        }
        # The GPU's own figure counts them too (535 MiB is the board's own use).
        assert session.memory_used_mb() == [535 + 30 * 1024, 535 + 14 * 1024]
        engine.kill()
        engine.wait()
        assert session.process_memory() == {4242: {uuid1: 12 * 2**30}}
        assert session.memory_used_mb() == [535, 535 + 12 * 1024]
    finally:
        engine.kill()
        engine.wait()


# ---- claims that must fit (the fake engine's take), and their high-water mark ---------

GIB = 2**30


def sleeper() -> subprocess.Popen:
    """A live process whose pid can hold a claim (a claim counts while its process lives)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_claim_the_gpu_has_no_room_for_is_refused_and_claims_nothing(tmp_path):
    from agentd.gpuclaims import OutOfMemory, claim, peak, take

    # given an 80 GiB H100 (535 MiB the driver's), someone else's 12 GiB job and an
    # engine holding 40 GiB
    spec = nvml_data.hgx(count=1)
    uuid = spec["gpus"][0]["uuid"]
    total = spec["gpus"][0]["memory_total_bytes"]
    spec["processes"] = [{"pid": 4242, "gpu": 0, "used_bytes": 12 * GIB}]
    path = nvml_data.write(tmp_path / "nvml.json", spec)
    first, second = sleeper(), sleeper()
    try:
        take(path, first.pid, {uuid: 40 * GIB})
        free = total - 535 * nvml_data.MIB - 52 * GIB
        # when a second engine asks for more than is left
        with pytest.raises(OutOfMemory) as refused:
            take(path, second.pid, {uuid: free + 1})
        # then it is told how much was free, and holds nothing
        assert (refused.value.wanted, refused.value.free, refused.value.total) == (
            free + 1, free, total,
        )  # fmt: skip
        lib = FakeNVML(path)
        lib.nvmlInit()
        assert [p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(_handle(lib))] == [
            4242, first.pid,
        ]  # fmt: skip
        # exactly what is left fits; an engine's own claim is not counted against it
        take(path, second.pid, {uuid: free})
        take(path, first.pid, {uuid: 40 * GIB})
        with pytest.raises(OutOfMemory):
            take(path, first.pid, {uuid: 40 * GIB + 1})
        # a claim made without the check (a test's stand-in) is not refused, only recorded
        claim(path, second.pid, {uuid: free + GIB})
        assert peak(path) == {uuid: 40 * GIB + free + GIB}
    finally:
        for p in (first, second):
            p.kill()
            p.wait()


def _handle(lib):
    return lib.nvmlDeviceGetHandleByIndex(0)


def test_the_peak_record_is_the_most_claimed_at_once_all_processes_together(tmp_path):
    from agentd.gpuclaims import claim, peak, peak_path, take

    spec = nvml_data.hgx(count=2)
    gpu0, gpu1 = (g["uuid"] for g in spec["gpus"])
    path = nvml_data.write(tmp_path / "nvml.json", spec)
    a, b = sleeper(), sleeper()
    try:
        assert peak(path) == {}  # nothing claimed yet
        take(path, a.pid, {gpu0: 30 * GIB, gpu1: 10 * GIB})
        take(path, b.pid, {gpu0: 20 * GIB})
        assert peak(path) == {gpu0: 50 * GIB, gpu1: 10 * GIB}
        # a release lowers what is held now, not the record
        claim(path, a.pid, {})
        take(path, b.pid, {gpu0: 45 * GIB})
        assert peak(path) == {gpu0: 50 * GIB, gpu1: 10 * GIB}
        take(path, a.pid, {gpu0: 10 * GIB})
        assert peak(path) == {gpu0: 55 * GIB, gpu1: 10 * GIB}
        assert json.loads(peak_path(path).read_text()) == peak(path)
        # a dead process's claim is freed, as the driver frees it
        b.kill()
        b.wait()
        take(path, a.pid, {gpu0: 60 * GIB})
        assert peak(path)[gpu0] == 60 * GIB
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


# One engine claiming: a slow write (50 ms between its check and its claim) widens the
# window in which engines that did not wait for each other would all see room.
RACER = """
import os, sys, time
from pathlib import Path
from agentd import gpuclaims
from agentd.gpuclaims import OutOfMemory, take
write = gpuclaims._write_claim
gpuclaims._write_claim = lambda *a: (time.sleep(0.05), write(*a))
print("ready", flush=True)
sys.stdin.readline()  # all at once
try:
    take(Path(sys.argv[1]), os.getpid(), {sys.argv[2]: int(sys.argv[3])})
    print("claimed", flush=True)
except OutOfMemory:
    print("refused", flush=True)
sys.stdin.read()  # hold the claim until told to go
"""


def test_engines_claiming_one_gpu_at_once_never_overcommit_it(tmp_path):
    # given an 80 GiB GPU and twelve engines each wanting 30 GiB of it at the same moment
    spec = nvml_data.hgx(count=1)
    uuid = spec["gpus"][0]["uuid"]
    total = spec["gpus"][0]["memory_total_bytes"]
    path = nvml_data.write(tmp_path / "nvml.json", spec)
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(path), uuid, str(30 * GIB)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )  # fmt: skip
        for _ in range(12)
    ]
    try:
        assert [r.stdout.readline().strip() for r in racers] == ["ready"] * 12
        for r in racers:
            r.stdin.write("go\n")
            r.stdin.flush()
        said = [r.stdout.readline().strip() for r in racers]
        # then two fit, the rest are refused, and the GPU never held more than it has
        assert sorted(said) == ["claimed"] * 2 + ["refused"] * 10
        from agentd.gpuclaims import peak

        assert peak(path) == {uuid: 60 * GIB}
        assert peak(path)[uuid] + spec["gpus"][0]["memory_used_bytes"] <= total
    finally:
        for r in racers:
            r.stdin.close()
            r.wait(10)
