"""What this machine is: memory, GPUs, InfiniBand fabrics, disks and the weights on them.

Every source is a parameter (the /proc and /sys paths included) so tests can
point discovery at a tree they build. Nothing here raises for a missing piece
of hardware: no GPU is a CPU node, no /sys/class/infiniband is no fabric.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISDIR

import psutil

from agentd import __version__, protocol
from agentd.fetch import store
from agentd.nvml import NVML, Checks

logger = logging.getLogger(__name__)

MEMINFO = Path("/proc/meminfo")
MOUNTS = Path("/proc/mounts")
INFINIBAND = Path("/sys/class/infiniband")

# Filesystems other machines see too: weights there are on every node that
# mounts them, and the space is not this node's alone.
SHARED_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "cephfs",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.cephfs",
        "fuse.juicefs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "9p",
        "virtiofs",
        "wekafs",
        "panfs",
    }
)


def memory_total_mb(meminfo: Path = MEMINFO) -> int | None:
    """MemTotal in MiB, or None when it cannot be read (unknown is not zero)."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024  # the kernel says kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _unescape(field_text: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_text)


def read_mounts(mounts: Path = MOUNTS) -> list[tuple[str, str]]:
    """(mount point, filesystem type), in the order the kernel lists them."""
    out = []
    try:
        text = mounts.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out.append((_unescape(parts[1]), parts[2]))
    return out


def filesystem_type(path: Path, mounts: list[tuple[str, str]]) -> str:
    """The type of the filesystem holding ``path``: the longest mount point above it wins."""
    real = os.path.realpath(path)
    best, kind = "", ""
    for point, fstype in mounts:
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        # Later mounts on the same point hide earlier ones, hence >=.
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def is_shared(path: Path, mounts: list[tuple[str, str]]) -> bool:
    return filesystem_type(path, mounts) in SHARED_FS


def storage(paths: list[Path], mounts: list[tuple[str, str]]) -> list[protocol.Storage]:
    out = []
    for path in paths:
        try:
            st = os.statvfs(path)
        except OSError:
            continue  # not there (yet): nothing to say about it
        out.append(
            protocol.Storage(
                path=str(path),
                free_bytes=st.f_bavail * st.f_frsize,
                total_bytes=st.f_blocks * st.f_frsize,
                shared=is_shared(path, mounts),
            )
        )
    return out


def tree_size(path: Path) -> int:
    """Bytes under ``path``, symlinks not followed: a Hugging Face cache's snapshots
    are links into its blobs, and following them would count every file twice."""
    try:
        st = path.stat()  # a top-level link to a model kept elsewhere counts what it names
    except OSError:
        return 0
    if not S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    stack = [str(path)]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def weights(dirs: list[Path], mounts: list[tuple[str, str]]) -> list[protocol.Weights]:
    """Each top-level entry of each weights dir, with its size. Hidden entries (a
    download's lock files, partial files, a fetch's staging dir) are not weights."""
    out = []
    for d in dirs:
        shared = is_shared(d, mounts)
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            # A fetched entry says where it came from and when it was last used
            # (agentd.fetch.store); its metadata file is read, never trusted for size.
            meta = store.read_meta(Path(entry.path)) if entry.is_dir() else None
            source = meta.get("source") if meta else ""
            last_used = meta.get("last_used") if meta else None
            out.append(
                protocol.Weights(
                    path=entry.path,
                    size_bytes=tree_size(Path(entry.path)),
                    shared=shared,
                    source=source if isinstance(source, str) else "",
                    last_used=_when(last_used),
                )
            )
    return out


def _when(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return None
    return float(value)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _rate_gbps(text: str) -> int:
    # "400 Gb/sec (4X NDR)", "100 Gb/sec (4X EDR)", "2.5 Gb/sec (1X SDR)"
    m = re.match(r"([\d.]+)\s*Gb/sec", text)
    return int(float(m.group(1))) if m else 0


def fabrics(root: Path = INFINIBAND, name: str = "") -> list[protocol.Fabric]:
    """InfiniBand fabrics: active IB ports grouped by subnet prefix.

    HCAs on one subnet reach each other; different prefixes are different
    fabrics. Most sites leave the subnet manager's default prefix, so an
    operator can name the fabric (``fabric_name``) to tell sites apart. A
    fabric's rate is its slowest HCA's: NCCL runs at the pace of the slowest rail.
    """
    groups: dict[str, dict[str, int]] = {}
    try:
        hcas = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    for hca in hcas:
        try:
            ports = sorted((hca / "ports").iterdir())
        except OSError:
            continue
        for port in ports:
            if _read(port / "link_layer") not in ("InfiniBand", ""):
                continue  # RoCE ports are Ethernet: not an IB fabric
            if "ACTIVE" not in _read(port / "state"):
                continue
            gid = _read(port / "gids" / "0")
            prefix = ":".join(gid.split(":")[:4]) if gid.count(":") >= 4 else "default"
            rate = _rate_gbps(_read(port / "rate"))
            group = groups.setdefault(prefix, {})
            group[hca.name] = min(group.get(hca.name, rate), rate)
    out = []
    for prefix, members in sorted(groups.items()):
        if name:
            fabric = name if len(groups) == 1 else f"{name}-{prefix}"
        else:
            fabric = f"ib-{prefix}"
        out.append(
            protocol.Fabric(
                fabric=fabric[:64], hcas=sorted(members), rate_gbps=min(members.values())
            )
        )
    return out


# What the protocol takes as an interface name (protocol.fields.IfName): a name
# outside it is not reported rather than refused with the whole register.
IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")


def interface_of(addr: str, table: dict[str, list] | None = None) -> str:
    """The name of the interface that holds ``addr`` ("" when none does, or no address).

    ``table`` is psutil.net_if_addrs()'s shape: name -> addresses with ``.address``.
    An IPv6 link-local address carries its scope ("fe80::1%eno1"): compared without it.
    """
    if not addr:
        return ""
    try:
        want = ipaddress.ip_address(addr)
    except ValueError:
        return ""
    if isinstance(want, ipaddress.IPv6Address) and want.ipv4_mapped:
        want = want.ipv4_mapped  # a dual-stack socket's view of an IPv4 address
    if table is None:
        try:
            table = psutil.net_if_addrs()
        except OSError as exc:
            logger.warning("cannot list network interfaces: %s", exc)
            return ""
    for name, addrs in sorted(table.items()):
        for a in addrs:
            try:
                have = ipaddress.ip_address(str(a.address).split("%", 1)[0])
            except ValueError:
                continue  # a link-layer (MAC) address
            if have == want and IFNAME.fullmatch(name):
                return name
    return ""


@dataclass
class Machine:
    """This node as discovery sees it, with the NVML session kept open between looks."""

    state_dir: Path
    weights_dirs: list[Path] = field(default_factory=list)
    fabric_name: str = ""
    checks: Checks = field(default_factory=Checks)
    meminfo: Path = MEMINFO
    mounts_file: Path = MOUNTS
    infiniband: Path = INFINIBAND
    nvml: NVML | None = None
    _nvml_opened: bool = False

    def gpu_session(self) -> NVML | None:
        if not self._nvml_opened:
            self.nvml = NVML.open()
            self._nvml_opened = True
        return self.nvml

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
            self.nvml = None

    def gpus(self) -> list[protocol.GPU]:
        session = self.gpu_session()
        return session.gpus(self.checks) if session else []

    def mounts(self) -> list[tuple[str, str]]:
        return read_mounts(self.mounts_file)

    def storage(self, mounts=None) -> list[protocol.Storage]:
        mounts = self.mounts() if mounts is None else mounts
        return storage([self.state_dir, *self.weights_dirs], mounts)

    def weights(self, mounts=None) -> list[protocol.Weights]:
        mounts = self.mounts() if mounts is None else mounts
        return weights(self.weights_dirs, mounts)

    def memory_total_mb(self) -> int | None:
        return memory_total_mb(self.meminfo)

    def fabrics(self) -> list[protocol.Fabric]:
        return fabrics(self.infiniband, self.fabric_name)

    def inventory(
        self,
        *,
        node_id: str,
        labels: dict | None = None,
        mgmt_addr: str = "",
        engine_versions: dict | None = None,
    ) -> dict:
        """A registration's fields, less what only the running agent knows (shards, version)."""
        mounts = self.mounts()
        return {
            "node_id": node_id,
            "hostname": socket.gethostname(),
            "mgmt_addr": mgmt_addr,
            "mgmt_interface": interface_of(mgmt_addr),
            "labels": labels or {},
            "agent_version": __version__,
            "engine_versions": engine_versions or {},
            "memory_total_mb": self.memory_total_mb(),
            "gpus": self.gpus(),
            "fabrics": self.fabrics(),
            "storage": self.storage(mounts),
            "weights": self.weights(mounts),
        }
