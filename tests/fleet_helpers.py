"""Plain helpers that build fleet objects and agent messages for tests."""

from datetime import timedelta

from agentd import protocol
from fleet.services import access

H100_GPUS = [
    {
        "index": i,
        "uuid": f"GPU-5f1c8a2e-{i:04x}-4b7d-9e2a-3c6f0d1b{i:04x}",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mb": 81559,
        "memory_used_mb": 0,
        "compute_capability": "9.0",
        "numa_node": 0 if i < 4 else 1,
        "pci_bus_id": f"00000000:{0x18 + i * 0x10:02X}:00.0",
        "driver_version": "550.90.07",
        "cuda_version": "12.4",
        "nvlink_peers": [j for j in range(8) if j != i],
        "ecc_errors": 0,
        "temperature_c": 34,
        "problems": [],
    }
    for i in range(8)
]


def register_msg(node_id="gpu-01", **overrides) -> dict:
    msg = {
        "type": "register",
        "v": 1,
        "node_id": node_id,
        "hostname": f"{node_id}.example",
        "mgmt_addr": "10.0.0.7",
        "labels": {"zone": "a"},
        "agent_version": "0.1.0",
        "engine_versions": {"llamacpp": "0.3.16"},
        "memory_total_mb": 2063500,
        "gpus": H100_GPUS,
        "fabrics": [{"fabric": "ib0", "hcas": ["mlx5_0", "mlx5_1"], "rate_gbps": 400}],
        "storage": [{"path": "/var/lib/llmgw", "free_bytes": 10**12, "total_bytes": 2 * 10**12}],
        "weights": [{"path": "/models/qwen", "size_bytes": 15 * 10**9}],
    }
    msg.update(overrides)
    return msg


def heartbeat_msg(seq=1, **overrides) -> dict:
    msg = {"type": "heartbeat", "v": 1, "seq": seq}
    msg.update(overrides)
    return msg


def join_token(name="rack-1", uses=1, ttl=timedelta(hours=1)) -> tuple:
    return access.create_join_token(name, ttl=ttl, max_uses=uses)


def parse(text: str):
    return protocol.parse_control_message(text)
