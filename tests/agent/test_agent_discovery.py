"""Memory, storage, weights and InfiniBand discovery against trees the tests build."""

import os
from pathlib import Path

import pytest

from agentd import discovery

MEMINFO = """MemTotal:       2113024000 kB
MemFree:        2000000000 kB
MemAvailable:   2050000000 kB
"""


def test_memtotal_in_mib(tmp_path):
    p = tmp_path / "meminfo"
    p.write_text(MEMINFO)
    assert discovery.memory_total_mb(p) == 2063500


def test_unreadable_meminfo_is_unknown_not_zero(tmp_path):
    assert discovery.memory_total_mb(tmp_path / "missing") is None
    (tmp_path / "garbled").write_text("MemTotal: lots\n")
    assert discovery.memory_total_mb(tmp_path / "garbled") is None


def test_real_meminfo():
    assert discovery.memory_total_mb() > 0


MOUNTS = """sysfs /sys sysfs rw,nosuid 0 0
/dev/nvme0n1p2 / ext4 rw,relatime 0 0
/dev/nvme1n1 /var/lib xfs rw 0 0
filer:/export/models /mnt/models nfs4 rw,vers=4.2 0 0
10.0.0.5@o2ib:/lustre /lustre lustre rw 0 0
/dev/sdb1 /mnt/my\\040disk ext4 rw 0 0
"""


def _mounts(tmp_path) -> list:
    p = tmp_path / "mounts"
    p.write_text(MOUNTS)
    return discovery.read_mounts(p)


def test_shared_filesystems_are_found_by_the_longest_mount_point(tmp_path):
    mounts = _mounts(tmp_path)
    assert discovery.filesystem_type(Path("/mnt/models/qwen"), mounts) == "nfs4"
    assert discovery.is_shared(Path("/mnt/models/qwen"), mounts)
    assert discovery.is_shared(Path("/lustre/proj/w"), mounts)
    assert not discovery.is_shared(Path("/var/lib/llmgw"), mounts)
    assert discovery.filesystem_type(Path("/var/lib/llmgw"), mounts) == "xfs"
    # /mnt/models-old is not under /mnt/models
    assert discovery.filesystem_type(Path("/mnt/models-old"), mounts) == "ext4"
    # octal escapes in mount points
    assert discovery.filesystem_type(Path("/mnt/my disk/x"), mounts) == "ext4"


def test_storage_reports_free_and_total_and_skips_missing_dirs(tmp_path):
    st = discovery.storage([tmp_path, tmp_path / "not-yet"], _mounts(tmp_path))
    assert [s.path for s in st] == [str(tmp_path)]
    vfs = os.statvfs(tmp_path)
    assert st[0].total_bytes == vfs.f_blocks * vfs.f_frsize
    assert 0 < st[0].free_bytes <= st[0].total_bytes


def test_weights_are_top_level_entries_with_sizes(tmp_path):
    w = tmp_path / "weights"
    model = w / "qwen2.5-7b"
    (model / "sub").mkdir(parents=True)
    (model / "model-00001.safetensors").write_bytes(b"x" * 3000)
    (model / "sub" / "tokenizer.json").write_bytes(b"y" * 500)
    (w / "tiny.gguf").write_bytes(b"z" * 1234)
    (w / ".locks").mkdir()
    # A Hugging Face cache: snapshots link into blobs, counted once.
    hf = w / "models--org--m"
    (hf / "blobs").mkdir(parents=True)
    (hf / "blobs" / "abc").write_bytes(b"b" * 10_000)
    (hf / "snapshots" / "rev").mkdir(parents=True)
    os.symlink("../../blobs/abc", hf / "snapshots" / "rev" / "model.safetensors")

    found = {Path(x.path).name: x.size_bytes for x in discovery.weights([w], [])}
    assert found["qwen2.5-7b"] == 3500
    assert found["tiny.gguf"] == 1234
    assert 10_000 <= found["models--org--m"] < 10_200  # the link itself is a few bytes
    assert ".locks" not in found


def test_weights_on_nfs_are_shared(tmp_path):
    w = tmp_path / "w"
    (w / "m").mkdir(parents=True)
    mounts = [("/", "ext4"), (str(w), "nfs4")]
    assert [x.shared for x in discovery.weights([w], mounts)] == [True]


def _hca(
    root: Path,
    name: str,
    rate: str,
    state="4: ACTIVE",
    layer="InfiniBand",
    gid="fe80:0000:0000:0000:a088:c203:00b1:2c3e",
    port="1",
):
    p = root / name / "ports" / port
    (p / "gids").mkdir(parents=True)
    (p / "rate").write_text(rate + "\n")
    (p / "state").write_text(state + "\n")
    (p / "link_layer").write_text(layer + "\n")
    (p / "gids" / "0").write_text(gid + "\n")


def test_infiniband_fabrics_from_sysfs(tmp_path):
    root = tmp_path / "infiniband"
    for i in range(4):
        _hca(root, f"mlx5_{i}", "400 Gb/sec (4X NDR)")
    _hca(root, "mlx5_4", "200 Gb/sec (4X HDR)")
    _hca(root, "mlx5_5", "400 Gb/sec (4X NDR)", state="1: DOWN")
    _hca(root, "mlx5_bond_0", "100 Gb/sec (4X EDR)", layer="Ethernet")  # RoCE
    fabs = discovery.fabrics(root)
    assert len(fabs) == 1
    assert fabs[0].fabric == "ib-fe80:0000:0000:0000"
    assert fabs[0].hcas == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"]
    assert fabs[0].rate_gbps == 200  # the slowest rail sets the pace


def test_fabrics_split_by_subnet_prefix_and_can_be_named(tmp_path):
    root = tmp_path / "infiniband"
    _hca(root, "mlx5_0", "400 Gb/sec (4X NDR)", gid="fec0:0000:0000:0001:0000:0000:0000:0001")
    _hca(root, "mlx5_1", "400 Gb/sec (4X NDR)", gid="fec0:0000:0000:0002:0000:0000:0000:0001")
    assert [f.fabric for f in discovery.fabrics(root)] == [
        "ib-fec0:0000:0000:0001",
        "ib-fec0:0000:0000:0002",
    ]
    _hca(root / "one", "mlx5_0", "400 Gb/sec (4X NDR)")
    assert [f.fabric for f in discovery.fabrics(root / "one", name="rack-a-ib")] == ["rack-a-ib"]


def test_no_infiniband_is_no_fabric(tmp_path):
    assert discovery.fabrics(tmp_path / "absent") == []


# ---- the management interface -------------------------------------------------


def _addrs(*addresses):
    """psutil.net_if_addrs()'s entries, as far as interface_of reads them."""
    from types import SimpleNamespace

    return [SimpleNamespace(address=a) for a in addresses]


IFACES = {
    "lo": _addrs("127.0.0.1", "::1"),
    "eno1": _addrs("b8:ce:f6:01:02:03", "10.0.0.11", "fe80::bace:f6ff:fe01:203%eno1"),
    "ib0": _addrs("192.168.100.11"),
    "weird name!": _addrs("10.9.9.9"),
}


@pytest.mark.parametrize(
    ("addr", "name"),
    [
        ("10.0.0.11", "eno1"),
        ("192.168.100.11", "ib0"),
        ("fe80::bace:f6ff:fe01:203", "eno1"),  # the scope is not part of the address
        ("::ffff:10.0.0.11", "eno1"),  # a dual-stack socket's local address
        ("127.0.0.1", "lo"),
        ("10.0.0.99", ""),  # on no interface here (NAT, a configured address)
        ("10.9.9.9", ""),  # a name the protocol would refuse is not reported
        ("", ""),
        ("not-an-ip", ""),
    ],
)
def test_the_interface_of_the_management_address(addr, name):
    assert discovery.interface_of(addr, IFACES) == name


def test_the_interface_of_a_real_address():
    assert discovery.interface_of("127.0.0.1") != ""
