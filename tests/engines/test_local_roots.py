"""Local model paths and adapter sources outside the node's roots, refused on real processes:
the shard fails or the adapter is failed with the reason, and no engine hears of the path."""

import os

import pytest

from agentd import protocol, state
from agentd.engines.base import http_get
from tests.engines.helpers import (
    Recorder,
    adapters_reported,
    desired,
    fake_supervisor,
    profile,
    shard,
)

pytestmark = pytest.mark.live

OUTSIDE = "/etc/passwd"  # a file that exists, which the fake engine would happily take


def refusal(what: str, path: str, roots) -> str:
    return (
        f"{what} {path} is not under a directory this node's agent.yaml names for weights "
        f"(weights_dirs or model_dirs: {', '.join(str(r) for r in roots)}); add its "
        "directory to model_dirs on this node to allow it. Nothing was read"
    )


async def test_a_model_path_outside_every_root_fails_the_shard_and_starts_no_engine(
    state_dir, tmp_path
):
    models = tmp_path / "models"
    models.mkdir()
    os.symlink(OUTSIDE, models / "passwd.gguf")  # a link in a root leading out of it
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, model_dirs=[models])
    await sup.start()
    try:
        # when: the desired set names a file outside every root this node names
        await sup.apply(desired(1, shard(profile=profile("fake", model_path=OUTSIDE))))
        failed = await rec.wait_for("r1-s0", "failed")

        # then: the shard fails naming the path and the agent.yaml keys, and no engine ran
        assert failed.error == refusal("model_path", OUTSIDE, [models])
        assert failed.last_output == []
        assert sup.process_groups() == {} and state.find_marked(state_dir) == {}
        assert not (state_dir / "shards" / "r1-s0.log").exists()

        # when: it names a link inside the root that leads out of it
        link, seen = str(models / "passwd.gguf"), len(rec.events)
        await sup.apply(desired(2, shard(profile=profile("fake", model_path=link))))
        failed = await rec.wait_for("r1-s0", "failed", after=seen)

        # then: the link is followed, and refused the same way
        assert failed.error.startswith(f"model_path {link} is not under a directory")
        assert f"(it resolves to {OUTSIDE})" in failed.error
        assert state.find_marked(state_dir) == {}

        # when: it names a path under the root
        inside, seen = str(models / "tiny.gguf"), len(rec.events)
        await sup.apply(desired(3, shard(profile=profile("fake", model_path=inside))))

        # then: the same node starts it
        await rec.wait_for("r1-s0", "ready", after=seen)
        assert list(sup.process_groups()) == ["r1-s0"]
    finally:
        await sup.close()


async def test_an_adapter_outside_every_root_is_failed_and_its_engine_never_told(
    state_dir, tmp_path
):
    models = tmp_path / "models"
    (models / "sql").mkdir(parents=True)
    sql = protocol.AdapterSpec(name="sql", source=str(models / "sql"))
    etc = protocol.AdapterSpec(name="etc", source=OUTSIDE)
    spec = shard(profile=profile("fake", max_adapters=2)).model_copy(
        update={"adapters": [etc, sql]}
    )
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, model_dirs=[models])
    await sup.start()
    try:
        # when: the engine (vLLM's runtime LoRA API) should hold one adapter under the
        # root and one outside it
        await sup.apply(desired(1, spec))
        await rec.wait_for("r1-s0", "ready")
        held = await adapters_reported(rec, lambda a: a == {"sql": "loaded", "etc": "failed"})

        # then: the one outside is failed with the reason, the other loaded
        assert held == {"sql": "loaded", "etc": "failed"}
        (reported,) = [a for a in rec.events[-1].adapters if a.name == "etc"]
        assert reported.error == refusal("adapter etc's source", OUTSIDE, [models])
        # and the engine, which loads any path that exists, was never given it
        (running,) = sup.running_shards()
        status, body = await http_get("127.0.0.1", running.port, "/v1/models", 2)
        assert status == 200 and b'"sql"' in body and b'"etc"' not in body
        assert OUTSIDE not in (state_dir / "shards" / "r1-s0.log").read_text()
    finally:
        await sup.close()
