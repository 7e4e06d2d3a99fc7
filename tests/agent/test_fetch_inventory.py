"""Fetched entries in the agent's weights report: once each, with source and last use, which
an engine running on an entry refreshes on the weights rescan (and no more often)."""

import time

from agentd.fetch import store
from agentd.supervised import NoShards
from tests.agent.test_agent_messages import make_agent


class UsingShards(NoShards):
    """A supervisor whose running engines use these local model paths."""

    def __init__(self, using):
        self._using = list(using)

    def weights_in_use(self):
        return self._using


def test_an_entry_in_use_gets_its_last_use_on_the_rescan(tmp_path):
    entry = tmp_path / "weights" / "mirror--tiny.gguf-0123456789ab"
    entry.mkdir(parents=True)
    (entry / "tiny.gguf").write_bytes(b"x" * 1000)
    store.write_meta(entry, {"source": "https://mirror/tiny.gguf", "last_used": None})
    (tmp_path / "weights" / ".fetch-other").mkdir()  # a fetch under way: not weights
    agent = make_agent(tmp_path, shards=UsingShards([str(entry / "tiny.gguf")]))
    agent.weights_rescan_s = 0
    before = time.time()

    first = agent.heartbeat_message()

    [w] = first.weights
    assert first.weights_changed
    assert (w.path, w.source) == (str(entry), "https://mirror/tiny.gguf")
    assert w.last_used is not None and w.last_used >= before - 1
    # within TOUCH_EVERY_S the entry is not written again, so nothing is news
    second = agent.heartbeat_message()
    assert not second.weights_changed
    assert store.read_meta(entry)["last_used"] == w.last_used


def test_an_entry_nobody_uses_keeps_its_last_use(tmp_path):
    entry = tmp_path / "weights" / "e"
    entry.mkdir(parents=True)
    store.write_meta(entry, {"source": "hf://org/tiny", "last_used": 1000.0})
    agent = make_agent(tmp_path, shards=UsingShards([]))
    agent.weights_rescan_s = 0

    [w] = agent.heartbeat_message().weights

    assert (w.source, w.last_used) == ("hf://org/tiny", 1000.0)


async def test_a_completed_fetch_is_reported_in_the_next_heartbeat(tmp_path):
    from agentd import protocol

    agent = make_agent(tmp_path, shards=UsingShards([]))
    agent.register_message()  # the last weights sent: none
    entry = tmp_path / "weights" / "e"
    entry.mkdir()
    store.write_meta(entry, {"source": "hf://org/tiny", "last_used": None})
    assert not agent.heartbeat_message().weights_changed  # the rescan (every 60 s) is not due

    await agent.on_shard_event(
        protocol.FetchProgress(
            type="fetch_progress",
            shard_id="s1",
            source="hf://org/tiny",
            bytes_done=5,
            bytes_total=5,
        )
    )

    hb = agent.heartbeat_message()
    assert hb.weights_changed and [w.source for w in hb.weights] == ["hf://org/tiny"]
