"""The supervisor puts engines to sleep and wakes them, with real processes
(docs/engines.md, "Sleep and wake"): through the fake engine's vLLM sleep API, where its
process stays; by stopping it where an engine has none; requests in flight first."""

import asyncio
import json

import pytest

from agentd import lifecycle
from agentd.engines.base import http_get
from tests.engines.helpers import Recorder, desired, fake_supervisor, http_post, shard

pytestmark = pytest.mark.live


async def started(state_dir, spec, **kwargs):
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, **kwargs)
    await sup.start()
    assert await sup.apply(desired(1, spec))
    await rec.wait_for(spec.shard_id, "ready")
    return sup, rec


def pid_of(sup, shard_id="r1-s0"):
    return sup.process_groups().get(shard_id)


async def test_an_engine_with_a_sleep_api_sleeps_and_wakes_in_place(state_dir):
    spec = shard(sleep_level=1)
    sup, rec = await started(state_dir, spec)
    try:
        (running,) = sup.running_shards()
        pid = pid_of(sup)

        # when: told to sleep
        mark = len(rec.events)
        assert await sup.apply(desired(2, shard(sleep_level=1, state="asleep")))
        await rec.wait_for("r1-s0", "asleep", after=mark)

        # then: the same process, asleep as vLLM says it
        assert pid_of(sup) == pid
        status, body = await http_get("127.0.0.1", running.port, "/is_sleeping", 2)
        assert (status, json.loads(body)) == (200, {"is_sleeping": True})

        # when: told to run again
        mark = len(rec.events)
        assert await sup.apply(desired(3, spec))
        await rec.wait_for("r1-s0", "ready", after=mark)

        # then: woken in place, and it answers
        assert pid_of(sup) == pid
        assert rec.states("r1-s0")[-3:] == ["asleep", "loading", "ready"]
        status, body = await http_get("127.0.0.1", running.port, "/is_sleeping", 2)
        assert json.loads(body) == {"is_sleeping": False}
        status, _ = await http_post(
            running.port, "/v1/completions", {"model": "tiny-llama", "prompt": "hi"}
        )
        assert status == 200
    finally:
        await sup.close()


async def test_a_woken_engine_is_ready_once_it_answers_not_at_its_idle_ticks_end(
    state_dir, monkeypatch
):
    # given: an asleep engine whose shard the supervisor looks at once a minute while idle
    monkeypatch.setattr(lifecycle, "TICK_READY_S", 60.0)
    spec = shard(sleep_level=1)
    sup, rec = await started(state_dir, spec)
    try:
        mark = len(rec.events)
        assert await sup.apply(desired(2, shard(sleep_level=1, state="asleep")))
        await rec.wait_for("r1-s0", "asleep", after=mark)

        # when: told to run again
        mark = len(rec.events)
        assert await sup.apply(desired(3, spec))

        # then: ready as soon as its health check answers, well inside the minute
        await rec.wait_for("r1-s0", "ready", after=mark, timeout=20)
        assert rec.states("r1-s0")[-3:] == ["asleep", "loading", "ready"]
    finally:
        await sup.close()


async def test_an_engine_without_one_sleeps_by_stopping_and_wakes_by_starting(state_dir):
    spec = shard()  # sleep_level 0: its engine was not started ready to sleep in place
    sup, rec = await started(state_dir, spec)
    try:
        pid = pid_of(sup)
        mark = len(rec.events)
        assert await sup.apply(desired(2, shard(state="asleep")))
        await rec.wait_for("r1-s0", "asleep", after=mark)
        assert pid_of(sup) is None  # stopped: its GPU memory is the driver's again

        mark = len(rec.events)
        assert await sup.apply(desired(3, spec))
        await rec.wait_for("r1-s0", "ready", after=mark)
        assert pid_of(sup) not in (None, pid)  # started again
        after = [e.state for e in rec.events[mark:] if e.type == "shard_status"]
        assert after[0] == "starting" and after[-1] == "ready"
    finally:
        await sup.close()


async def test_requests_in_flight_finish_before_the_engine_sleeps(state_dir):
    spec = shard(sleep_level=1, args=["--token-delay", "0.2"])
    sup, rec = await started(state_dir, spec)
    try:
        (running,) = sup.running_shards()
        # given: a completion of 10 tokens at 0.2 s each, in flight
        answer = asyncio.ensure_future(
            http_post(
                running.port,
                "/v1/completions",
                {"model": "tiny-llama", "prompt": "hi", "max_tokens": 10},
            )
        )
        await asyncio.sleep(0.5)

        # when: told to sleep
        mark = len(rec.events)
        assert await sup.apply(
            desired(2, shard(sleep_level=1, state="asleep", args=["--token-delay", "0.2"]))
        )
        await rec.wait_for("r1-s0", "asleep", after=mark)

        # then: the answer was whole before the engine slept
        assert answer.done()
        status, body = answer.result()
        assert status == 200
        assert json.loads(body)["usage"]["completion_tokens"] == 10
    finally:
        await sup.close()


async def test_an_asleep_engine_is_adopted_asleep_by_the_next_agent(state_dir):
    spec = shard(sleep_level=1)
    sup, rec = await started(state_dir, spec)
    asleep_spec = shard(sleep_level=1, state="asleep")
    assert await sup.apply(desired(2, asleep_spec))
    await rec.wait_for("r1-s0", "asleep")
    pid = pid_of(sup)
    await sup.close()

    # when: a new agent starts over the same state dir
    rec2 = Recorder()
    sup2 = fake_supervisor(state_dir, rec2)
    try:
        await sup2.start()
        # then: the same engine, still asleep; told to run, it wakes
        assert [s.state for s in sup2.running_shards()] == ["asleep"]
        assert pid_of(sup2) == pid
        assert await sup2.apply(desired(3, spec))
        await rec2.wait_for("r1-s0", "ready")
        assert pid_of(sup2) == pid
    finally:
        await sup2.close()
        await sup.close()
