"""The clean-up's rules as a pure function: which weights go, and the reason operators read."""

import pytest

from fleet.services.weight_names import Wanted, names
from fleet.services.weights_gc.rules import Entry, Filesystem, Policy, select

H = 3600.0
NOW = 1_000_000.0
W = "/var/lib/llmgw/weights"


def entry(pk, path, node="n1", size=10, **kw) -> Entry:
    return Entry(id=pk, node_id=node, path=f"{W}/{path}", size_bytes=size, **kw)


def go(entries, needed=None, filesystems=(), connected=("n1", "n2", "n3"), now=NOW, **policy):
    needed = {n: Wanted(paths) for n, paths in (needed or {}).items()}
    return select(list(entries), needed, list(filesystems), set(connected), now, Policy(**policy))


def gone(decision) -> list[str]:
    return [f"{p.entry.node_id}:{p.entry.path.rsplit('/', 1)[-1]}" for p in decision.proposals]


# ---- matching weights to the shards that need them ---------------------------------


@pytest.mark.parametrize(
    ("path", "source", "model_path", "serves"),
    [
        (f"{W}/tiny.gguf", "", f"{W}/tiny.gguf", True),
        (f"{W}/org/name", "", "org/name", True),
        (f"{W}/org/name", "", "name", True),
        (f"{W}/org/name", "", "other/name", False),
        (f"{W}/models--Qwen--Qwen3-8B", "", "Qwen/Qwen3-8B", True),
        (f"{W}/models--Qwen--Qwen3-8B", "", "Qwen/Qwen3-4B", False),
        (f"{W}/f0a1", "https://h.example/tiny.gguf", "https://h.example/tiny.gguf", True),
        (f"{W}/f0a1", "hf://org/name@v2", "hf://org/name@v1", False),
        (f"{W}/tiny.gguf", "", "/elsewhere/tiny.gguf", False),
        (f"{W}/xtiny.gguf", "", "tiny.gguf", False),
    ],
)
def test_an_entry_serves_a_profile_by_path_tail_hub_cache_name_or_source(
    path, source, model_path, serves
):
    assert Wanted([model_path]).serves(path, source) is serves
    # The one rule placement's index uses says the same about paths.
    if not source:
        assert (model_path.strip("/") in names(path)) is serves


# ---- retention ------------------------------------------------------------------------


def test_unused_entries_go_after_the_retention_and_not_before():
    entries = [
        entry(1, "old", unused_since=NOW - 25 * H),
        entry(2, "recent", unused_since=NOW - 23 * H),
        entry(3, "serving", unused_since=NOW - 99 * H),
    ]
    d = go(entries, needed={"n1": [f"{W}/serving"]})
    assert gone(d) == ["n1:old"]
    assert d.proposals[0].reason == "unused for 25 h (retention 24 h)"
    assert d.became_used == [3]  # needed again: its clock stops


def test_a_newly_seen_entry_starts_its_clock_now():
    d = go([entry(1, "new")])
    assert d.proposals == [] and d.became_unused == [1]


def test_the_node_saying_it_used_an_entry_recently_keeps_it():
    e = entry(1, "old", unused_since=NOW - 30 * H, last_used=NOW - 2 * H)
    assert gone(go([e])) == []


def test_a_models_retention_overrides_the_fleets_either_way():
    entries = [
        entry(1, "short", unused_since=NOW - 2 * H),
        entry(2, "long", unused_since=NOW - 30 * H),
        entry(3, "plain", unused_since=NOW - 30 * H),
    ]
    d = go(entries, overrides=((f"{W}/short", 1 * H), ("long", 48 * H)))
    assert sorted(gone(d)) == ["n1:plain", "n1:short"]
    assert "retention 1 h" in next(p.reason for p in d.proposals if p.entry.id == 1)


def test_pinned_busy_and_unreachable_entries_are_not_proposed():
    old = NOW - 99 * H
    entries = [
        entry(1, "pinned", unused_since=old, pinned=True),
        entry(2, "busy", unused_since=old, busy=True),
        entry(3, "away", node="n9", unused_since=old),
        entry(4, "free", unused_since=old),
    ]
    assert gone(go(entries)) == ["n1:free"]


def test_an_operators_request_skips_the_retention_but_not_the_rules():
    entries = [
        entry(1, "asked", unused_since=NOW, remove_requested=True),
        entry(2, "asked-pinned", remove_requested=True, pinned=True),
        entry(3, "asked-in-use", remove_requested=True),
    ]
    d = go(entries, needed={"n1": ["asked-in-use"]})
    assert gone(d) == ["n1:asked"]
    assert d.proposals[0].reason == "an operator asked to remove it"
    assert sorted((e.id, why.split(" ")[0]) for e, why in d.refused) == [(2, "pinned"), (3, "in")]


def test_an_operators_request_that_must_wait_says_why_and_stands():
    entries = [
        entry(1, "under-way", remove_requested=True, busy=True),
        entry(2, "away", node="n9", remove_requested=True),
        # a shared copy asked for on n1: another node's copy is being removed already
        entry(3, "shared", node="n1", shared=True, remove_requested=True),
        entry(4, "shared", node="n2", shared=True, busy=True),
        # and one asked for on the node that is away, proposed to a node that is here
        entry(5, "shared-too", node="n9", shared=True, remove_requested=True),
        entry(6, "shared-too", node="n2", shared=True),
    ]
    d = go(entries)
    assert gone(d) == ["n2:shared-too"]
    assert d.refused == []
    assert [(e.id, why) for e, why in d.waiting] == [
        (1, "a removal of it is already under way"),
        (2, "its node is not connected: proposed when it is back"),
        (3, "a removal of it is already under way"),
    ]


def test_a_refused_request_is_not_also_said_to_wait():
    # pinned, or in use, on a node that is away: refused, and only refused
    entries = [
        entry(1, "pinned-away", node="n9", remove_requested=True, pinned=True),
        entry(2, "used-away", node="n9", remove_requested=True),
    ]
    d = go(entries, needed={"n9": ["used-away"]})
    assert [(e.id, why.split(" ")[0]) for e, why in d.refused] == [(1, "pinned"), (2, "in")]
    assert d.waiting == [] and d.proposals == []


# ---- shared filesystems ----------------------------------------------------------------


def test_a_shared_entry_is_unused_only_when_no_node_needs_it():
    old = NOW - 99 * H
    rows = [
        entry(1, "shared-model", node="n1", shared=True, unused_since=old),
        entry(2, "shared-model", node="n2", shared=True, unused_since=old),
    ]
    # A shard on n2 needs it: n1's copy is the same copy, so it stays too.
    assert gone(go(rows, needed={"n2": ["shared-model"]})) == []
    # Nobody needs it: proposed once, to one node that sees it.
    assert gone(go(rows)) == ["n1:shared-model"]
    assert gone(go(rows, connected=("n2",))) == ["n2:shared-model"]


def test_a_pin_on_any_node_pins_the_shared_copy():
    old = NOW - 99 * H
    rows = [
        entry(1, "m", node="n1", shared=True, unused_since=old),
        entry(2, "m", node="n2", shared=True, unused_since=old, pinned=True),
    ]
    assert gone(go(rows)) == []


# ---- watermarks --------------------------------------------------------------------------


def test_past_the_high_watermark_least_recently_used_go_until_under_the_low_one():
    fs = Filesystem("n1", W, free_bytes=100, total_bytes=1000)  # 90 % used
    entries = [  # all unused, none past the retention
        entry(1, "a", size=60, unused_since=NOW - 3 * H),
        entry(2, "b", size=60, unused_since=NOW - 1 * H, last_used=NOW - 5 * H),
        entry(3, "c", size=60, unused_since=NOW - 2 * H),
        entry(4, "d", size=60, unused_since=NOW - 4 * H),
        entry(5, "in-use", size=500),
        entry(6, "pinned", size=500, unused_since=NOW - 9 * H, pinned=True),
    ]
    d = go(entries, filesystems=[fs], needed={"n1": [f"{W}/in-use"]})
    # 900 used; 750 is the low watermark: d (oldest), a, c go (180), and b stays.
    assert gone(d) == ["n1:d", "n1:a", "n1:c"]
    assert d.proposals[0].reason.startswith(f"{W} is 90% full (high watermark 85%)")


def test_under_the_high_watermark_nothing_goes_early():
    fs = Filesystem("n1", W, free_bytes=200, total_bytes=1000)  # 80 %: between the marks
    assert gone(go([entry(1, "a", size=500, unused_since=NOW - H)], filesystems=[fs])) == []


def test_retention_removals_count_toward_the_low_watermark():
    fs = Filesystem("n1", W, free_bytes=100, total_bytes=1000)
    entries = [
        entry(1, "expired", size=200, unused_since=NOW - 30 * H),
        entry(2, "lru", size=50, unused_since=NOW - 2 * H),
    ]
    assert gone(go(entries, filesystems=[fs])) == ["n1:expired"]  # 700 < 750 already


def test_a_shared_filesystem_counts_once_and_only_its_entries_go():
    shared_fs = [Filesystem(n, "/mnt/models", 50, 1000, shared=True) for n in ("n1", "n2")]
    local_fs = Filesystem("n1", W, 900, 1000)
    entries = [
        Entry(1, "n1", "/mnt/models/big", 300, shared=True, unused_since=NOW - H),
        Entry(2, "n2", "/mnt/models/big", 300, shared=True, unused_since=NOW - H),
        entry(3, "local", size=10, unused_since=NOW - 5 * H),
    ]
    assert gone(go(entries, filesystems=[*shared_fs, local_fs])) == ["n1:big"]
