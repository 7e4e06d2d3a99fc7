"""A profile's env may not change what code an engine loads unless agent.yaml allows it."""

import pytest

from agentd.engineconfig import refused_env
from tests.engines.helpers import profile, shard
from tests.engines.test_supervisor_faults import started


@pytest.mark.parametrize(
    "env, allowed, refused",
    [
        ({"OMP_NUM_THREADS": "4", "VLLM_USE_V1": "1"}, set(), []),
        ({"LD_PRELOAD": "/tmp/x.so"}, set(), ["LD_PRELOAD"]),
        ({"LD_BIND_NOW": "1", "PYTHONPATH": "/tmp"}, set(), ["LD_BIND_NOW", "PYTHONPATH"]),
        ({"LD_LIBRARY_PATH": "/opt/cuda/lib64"}, {"LD_LIBRARY_PATH"}, []),
        ({"CUDA_INJECTION64_PATH": "/tmp/x.so"}, {"LD_PRELOAD"}, ["CUDA_INJECTION64_PATH"]),
    ],
)
def test_which_names_are_refused(env, allowed, refused):
    assert refused_env(env, allowed) == refused


async def test_a_shard_setting_ld_preload_fails_naming_it(state_dir):
    spec = shard(profile=profile("fake", env={"LD_PRELOAD": "/tmp/evil.so"}))
    sup, rec = await started(state_dir, spec)
    try:
        failed = await rec.wait_for("r1-s0", "failed")
        assert "sets LD_PRELOAD in its env" in failed.error
        assert "engines.allow_env" in failed.error
        assert sup.process_groups() == {}
    finally:
        await sup.close()


async def test_a_node_that_allows_the_name_starts_the_shard(state_dir):
    spec = shard(profile=profile("fake", env={"LD_LIBRARY_PATH": "/opt/lib"}))
    sup, rec = await started(state_dir, spec, allow_env=["LD_LIBRARY_PATH"])
    try:
        await rec.wait_for("r1-s0", "ready")
    finally:
        await sup.close()
