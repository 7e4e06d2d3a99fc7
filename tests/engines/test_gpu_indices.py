"""vLLM 0.11 reads CUDA_VISIBLE_DEVICES as integers: its shards get NVML indices, in NVML's
(PCI bus) order, while engines that take UUIDs keep the UUIDs placement names."""

import asyncio
import time

import pytest

from tests.engines.helpers import (
    H100_UUIDS,
    Recorder,
    desired,
    fake_supervisor,
    profile,
    shard,
    stub_binary,
)

pytestmark = pytest.mark.live

# GPU 3 and GPU 7 of the node, by UUID, as placement hands them to a shard.
INDICES = {H100_UUIDS[0]: 7, H100_UUIDS[1]: 3}


def _env_seen(path, timeout=20.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("END\n"):
            lines = path.read_text().splitlines()[:-1]
            return dict(line.split("=", 1) for line in lines if "=" in line)
        time.sleep(0.05)
    raise AssertionError(f"the engine never wrote {path}")


async def test_a_vllm_shard_sees_its_gpus_by_nvml_index_in_pci_bus_order(state_dir, tmp_path):
    seen = tmp_path / "env"
    # A stand-in for vllm that writes the environment it was given, then serves nothing.
    vllm = stub_binary(
        tmp_path,
        "vllm",
        (
            '[ "$1" = --version ] && { echo 0.11.2; exit 0; }; '
            f'env > "{seen}"; echo END >> "{seen}"; sleep 60'
        ),
    )
    rec = Recorder()
    sup = fake_supervisor(
        state_dir, rec, binaries={"vllm": vllm}, gpu_indices=lambda: dict(INDICES)
    )
    await sup.start()
    try:
        p = profile("vllm", model_path=str(tmp_path / "m"), tp=2, gpus_per_node=2)
        await sup.apply(desired(1, shard(engine="vllm", profile=p, gpu_uuids=H100_UUIDS)))
        env = await asyncio.to_thread(_env_seen, seen)
    finally:
        await sup.close()
    assert env["CUDA_VISIBLE_DEVICES"] == "7,3"  # the shard's order, each GPU's NVML index
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # CUDA counts as NVML does


async def test_a_gpu_the_node_does_not_have_fails_the_shard_naming_it(state_dir, tmp_path):
    vllm = stub_binary(tmp_path, "vllm", '[ "$1" = --version ] && echo 0.11.2 || sleep 60')
    rec = Recorder()
    sup = fake_supervisor(
        state_dir, rec, binaries={"vllm": vllm}, gpu_indices=lambda: {H100_UUIDS[0]: 0}
    )
    await sup.start()
    try:
        p = profile("vllm", model_path=str(tmp_path / "m"), tp=2, gpus_per_node=2)
        await sup.apply(desired(1, shard(engine="vllm", profile=p, gpu_uuids=H100_UUIDS)))
        failed = await asyncio.wait_for(_failed(rec, "r1-s0"), 20)
    finally:
        await sup.close()
    assert failed.error == f"GPU {H100_UUIDS[1]} is not on this node"


async def _failed(rec: Recorder, shard_id: str):
    while (got := rec.last(shard_id, "failed")) is None:
        await asyncio.sleep(0.05)
    return got
