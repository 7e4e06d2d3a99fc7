"""The supervisor fetches a shard's weights before starting its engine: starting meanwhile with
progress, one fetch for two shards of one source, a fetch dropped with the last shard wanting it.
Real processes: the fake engine, and a local HTTP server for the weights."""

import asyncio
import os

import pytest

from agentd.fetch.fetcher import Fetcher, FetchSettings
from tests.engines.helpers import Recorder, desired, fake_supervisor, profile, shard
from tests.processes.weights_server import WeightsServer

DATA = os.urandom(200_000)


def loopback_fetcher(*roots) -> Fetcher:
    """A node's fetcher into ``roots``, allowing loopback, where the weights server listens
    (a node refuses internal addresses unless its agent.yaml allows them)."""
    return Fetcher(FetchSettings(roots=list(roots), allow_networks=("127.0.0.0/8",)))


@pytest.fixture
def server():
    with WeightsServer() as srv:
        srv.files["w/tiny.gguf"] = DATA
        yield srv


def spec(shard_id, url, **fields):
    return shard(shard_id, profile=profile("fake", model_path=url, **fields))


async def until(check, what, timeout=30):
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


async def test_two_shards_of_one_source_share_a_fetch_and_start_after_it(
    state_dir, tmp_path, server
):
    server.rate = 100_000  # two seconds
    weights = tmp_path / "weights"
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, fetcher=loopback_fetcher(weights))
    await sup.start()
    url = server.url("w/tiny.gguf")
    try:
        await sup.apply(desired(1, spec("r1-s0", url), spec("r2-s0", url, name="other")))

        for sid in ("r1-s0", "r2-s0"):
            await rec.wait_for(sid, "ready")
            # pending, starting (the fetch, then the engine), ready: progress is no transition
            assert rec.states(sid) == ["pending", "starting", "ready"]
            progress = [e for e in rec.events if e.type == "fetch_progress" and e.shard_id == sid]
            assert progress[-1].bytes_done == progress[-1].bytes_total == len(DATA)
            assert {p.source for p in progress} == {url}
        assert server.sent["/w/tiny.gguf"] == len(DATA)  # fetched once for both
        [entry] = [p for p in weights.iterdir()]
        assert str(entry) in sup.paths_in_use() and url in sup.paths_in_use()
    finally:
        await sup.close()


async def test_the_last_shard_leaving_stops_the_fetch_and_removes_its_files(
    state_dir, tmp_path, server
):
    server.rate = 10_000  # far longer than the test
    weights = tmp_path / "weights"
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, fetcher=loopback_fetcher(weights))
    await sup.start()
    url = server.url("w/tiny.gguf")
    try:
        await sup.apply(desired(1, spec("r1-s0", url), spec("r2-s0", url, name="other")))
        await until(lambda: list(weights.glob(".fetch-*/*.partial")), "the partial file")

        await sup.apply(desired(2, spec("r2-s0", url, name="other")))  # one leaves
        await rec.wait_for("r1-s0", "stopped")
        assert list(weights.glob(".fetch-*/*.partial"))  # the other still wants it

        await sup.apply(desired(3))  # the last one leaves
        await until(lambda: not list(weights.glob(".fetch-*")), "the staging dir to go")
        assert "ready" not in rec.states("r2-s0")
    finally:
        await sup.close()


async def test_a_failed_fetch_fails_the_shard_with_the_reason(state_dir, tmp_path, server):
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, fetcher=loopback_fetcher(tmp_path / "w"))
    await sup.start()
    try:
        await sup.apply(desired(1, spec("r1-s0", server.url("w/missing.gguf"))))
        failed = await rec.wait_for("r1-s0", "failed")
        assert "fetching weights failed" in failed.error and "answered 404" in failed.error
        assert rec.states("r1-s0") == ["pending", "starting", "failed"]
    finally:
        await sup.close()


async def test_an_agent_without_weights_dirs_says_so(state_dir, server):
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, fetcher=loopback_fetcher())
    await sup.start()
    try:
        await sup.apply(desired(1, spec("r1-s0", server.url("w/tiny.gguf"))))
        failed = await rec.wait_for("r1-s0", "failed")
        assert "agent.yaml names no weights_dirs" in failed.error
    finally:
        await sup.close()
