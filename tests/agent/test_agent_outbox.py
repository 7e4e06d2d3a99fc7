"""The agent's outbox: coalesced while the socket is down, never silently short of news."""

import pytest

from agentd import protocol
from agentd.outbox import LOGS_REPLIES_KEPT, Outbox


def status(shard_id: str, state: str, **fields) -> protocol.ShardStatus:
    return protocol.ShardStatus(type="shard_status", shard_id=shard_id, state=state, **fields)


def progress(shard_id: str, done: int) -> protocol.FetchProgress:
    return protocol.FetchProgress(type="fetch_progress", shard_id=shard_id, bytes_done=done)


def ack(version: int, of: str = "desired") -> protocol.AgentAck:
    return protocol.AgentAck(type="ack", of=of, version=version)


def drain(box: Outbox) -> list:
    """What a socket would send, in order."""
    out = []
    while box:
        key, msg = box.first()
        out.append(msg)
        box.sent(key, msg)
    return out


def brief(msgs) -> list[tuple]:
    def one(m):
        if m.type == "shard_status":
            return (m.shard_id, m.state)
        if m.type == "fetch_progress":
            return (m.shard_id, "progress", m.bytes_done)
        if m.type == "ack":
            return ("ack", m.of, m.version)
        return (m.type, m.request_id)

    return [one(m) for m in msgs]


def test_a_burst_while_disconnected_leaves_the_newest_status_per_shard_in_order():
    box = Outbox()
    states = ["pending", "starting", "loading", "ready", "draining", "stopped"]
    # given thousands of statuses for 50 shards, interleaved
    for i in range(6000):
        box.put(status(f"s{i % 50}", states[(i // 50) % len(states)]))

    sent = drain(box)

    # then one per shard, the newest, in the order their newest was queued
    assert len(sent) == 50
    assert brief(sent) == [(f"s{i}", "stopped") for i in range(50)]
    assert box.coalesced["shard_status"] == 6000 - 50


def test_a_failure_survives_later_statuses_of_its_shard():
    box = Outbox()
    box.put(status("s1", "loading"))
    box.put(status("s1", "failed", error="CUDA out of memory", exit_code=1, last_output=["OOM"]))
    for state in ("pending", "starting", "loading", "ready"):
        box.put(status("s1", state))

    sent = drain(box)

    assert brief(sent) == [("s1", "failed"), ("s1", "ready")]
    assert sent[0].error == "CUDA out of memory" and sent[0].exit_code == 1
    assert sent[0].last_output == ["OOM"]


def test_a_newer_failure_replaces_the_older_and_what_came_between():
    box = Outbox()
    box.put(status("s1", "failed", error="first", exit_code=1))
    box.put(status("s1", "starting"))
    box.put(status("s1", "failed", error="second", exit_code=137))

    sent = drain(box)

    assert brief(sent) == [("s1", "failed")]
    assert (sent[0].error, sent[0].exit_code) == ("second", 137)


def test_order_of_different_shards_is_kept():
    box = Outbox()
    box.put(status("a", "starting"))
    box.put(status("b", "stopped"))
    box.put(status("c", "failed", error="x"))
    box.put(status("a", "ready"))  # newer than b's and c's news: it goes after them

    assert brief(drain(box)) == [("b", "stopped"), ("c", "failed"), ("a", "ready")]


def test_progress_is_newest_per_shard_and_never_replaces_a_status():
    box = Outbox()
    box.put(status("s1", "starting"))
    for done in range(0, 10_000, 10):
        box.put(progress("s1", done))
    box.put(progress("s2", 5))

    assert brief(drain(box)) == [
        ("s1", "starting"),
        ("s1", "progress", 9990),
        ("s2", "progress", 5),
    ]


def test_the_newest_desired_ack_supersedes_older_ones_and_an_older_one_changes_nothing():
    box = Outbox()
    for version in range(1, 500):
        box.put(ack(version))
    box.put(ack(3))  # late, and older than what is queued
    box.put(ack(0, of="remove_weights"))

    assert brief(drain(box)) == [("ack", "desired", 499), ("ack", "remove_weights", 0)]


def test_every_weights_removal_reply_is_kept_until_sent():
    box = Outbox()
    for request, path in (("rw-1", "/w/a.gguf"), ("rw-2", "/w/b.gguf")):
        box.put(
            protocol.AgentAck(type="ack", of="remove_weights", request_id=request, removed=[path])
        )
    box.put(ack(7))

    sent = drain(box)

    assert [(m.request_id, m.removed) for m in sent if m.of == "remove_weights"] == [
        ("rw-1", ["/w/a.gguf"]),
        ("rw-2", ["/w/b.gguf"]),
    ]
    assert box.coalesced["ack"] == 0


def test_logs_replies_are_bounded_to_the_newest():
    box = Outbox()
    for i in range(20):
        box.put(protocol.LogsReply(type="logs_reply", request_id=f"q{i}"))

    sent = drain(box)

    assert [m.request_id for m in sent] == [f"q{i}" for i in range(20 - LOGS_REPLIES_KEPT, 20)]
    assert box.coalesced["logs_reply"] == 20 - LOGS_REPLIES_KEPT


def test_the_outbox_is_bounded_by_shards_not_by_time():
    box = Outbox()
    for round_ in range(200):
        for s in range(10):
            box.put(status(f"s{s}", "failed" if round_ % 7 == 0 else "loading", error="e"))
            box.put(progress(f"s{s}", round_))
        box.put(ack(round_))
        box.put(protocol.LogsReply(type="logs_reply", request_id=f"q{round_}"))

    # two statuses and one progress per shard, one ack, a few logs replies
    assert len(box) <= 10 * 3 + 1 + LOGS_REPLIES_KEPT


def test_a_message_replaced_while_it_was_being_sent_is_not_lost():
    box = Outbox()
    box.put(status("s1", "loading"))
    key, msg = box.first()
    # while the socket sends it, the shard becomes ready
    box.put(status("s1", "ready"))
    box.sent(key, msg)

    assert brief(drain(box)) == [("s1", "ready")]


@pytest.mark.parametrize("kind", ["shard_status", "fetch_progress"])
def test_coalescing_is_told_once_per_change(kind):
    box = Outbox()
    make = status if kind == "shard_status" else progress
    arg = "ready" if kind == "shard_status" else 1
    box.put(make("s1", arg))
    assert box.coalesced_news() is None
    box.put(make("s1", arg))
    assert box.coalesced_news() == {kind: 1}
    assert box.coalesced_news() is None
