"""Realistic NVML answers for the test double (agentd/nvml_double.py).

Values as an HGX H100 / H200 node's driver reports them: the marketing names
NVML returns, memory in bytes (81559 MiB for an H100 80GB HBM3, 143771 MiB for
an H200), UUIDs in NVML's GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx form, PCI
bus ids with NVML's 8-digit domain, and every NVLink ending at an NVSwitch.
"""

import json
from pathlib import Path

MIB = 2**20
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "cc": [9, 0]}
H200 = {"name": "NVIDIA H200", "memory_mib": 143771, "cc": [9, 0]}
# The PCI buses of an HGX baseboard's eight GPUs (Dell XE9680 / Supermicro layouts).
HGX_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
NVSWITCH_BUSES = ["05", "06", "07", "08"]
NVLINKS_PER_H100 = 18


def gpu(i: int, kind=H100, **overrides) -> dict:
    g = {
        "uuid": f"GPU-5f1c8a2e-{0x3B00 + i:04x}-4d7e-9a1b-0c2d3e4f{0x5A60 + i:04x}",
        "name": kind["name"],
        "memory_total_bytes": kind["memory_mib"] * MIB,
        "memory_used_bytes": 535 * MIB,  # what the driver itself holds on an idle H100
        "compute_capability": kind["cc"],
        "numa_node": 0 if i < 4 else 1,
        "pci_bus_id": f"00000000:{HGX_BUSES[i]}:00.0",
        "temperature_c": 31 + i,
        "slowdown_c": 90,
        "ecc_volatile_uncorrected": 0,
        "remapped_rows": [0, 0, 0, 0],
        "retired_pages_pending": None,  # Hopper remaps rows instead: NotSupported
        "retired_pages": None,
        # What a datacenter board supports; clock-change events were Kepler's only.
        "event_types": ["single_bit_ecc", "double_bit_ecc", "pstate", "xid"],
        "clocks_event_reasons": ["gpu_idle"],  # nothing running, clocks dropping to idle
        "nvlinks": [
            {
                "active": True,
                "remote_type": "switch",
                "remote_pci_bus_id": f"00000000:{NVSWITCH_BUSES[link % 4]}:00.0",
            }
            for link in range(NVLINKS_PER_H100)
        ],
    }
    g.update(overrides)
    return g


def hgx(kind=H100, count=8, **overrides) -> dict:
    spec = {
        "library": "present",
        "driver_version": "550.90.07",
        "cuda_driver_version": 12040,
        "gpus": [gpu(i, kind) for i in range(count)],
    }
    spec.update(overrides)
    return spec


def h100_nvl_pairs() -> dict:
    """Two H100 NVL cards bridged in pairs: links end at the other GPU, no switch."""
    spec = hgx(count=4)
    for i, g in enumerate(spec["gpus"]):
        g["name"] = "NVIDIA H100 NVL"
        g["memory_total_bytes"] = 95830 * MIB
        peer = i ^ 1
        g["nvlinks"] = [
            {
                "active": True,
                "remote_type": "gpu",
                "remote_pci_bus_id": spec["gpus"][peer]["pci_bus_id"],
            }
            for _ in range(12)
        ]
    return spec


def write(path: Path, spec: dict) -> Path:
    path.write_text(json.dumps(spec))
    return path
