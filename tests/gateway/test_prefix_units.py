"""Prefix-aware routing's pure parts: the prompt's prefix, the ring, the bounded-load choice."""

import collections
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.gateway import choice, prefix, table
from tests.gateway.test_gateway_units import replica, shard

ROOT = Path(__file__).resolve().parents[2]
ON = table.ModelView(1, "m", 1700000000, 3, prefix_routing=True)
POLICY = prefix.Policy(load_factor=1.25, margin=8, max_outstanding=256)


def route_of(*ids, model=ON, old=None):
    views = [replica(r, shard(port=8000 + i)) for i, r in enumerate(ids)]
    return table.build_routes([model], views, old)["m"]


def chat(system: str, user: str = "hi") -> dict:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }


def key(n: int) -> int:
    return prefix.key_of("completions", {"prompt": f"prompt number {n}"}, 1024)


# ---- the prefix ---------------------------------------------------------------


def test_chat_requests_sharing_a_system_prompt_longer_than_k_share_a_key():
    system = "You are a careful assistant. " * 50  # 1450 characters
    a = prefix.key_of("chat/completions", chat(system, "What is a GPU?"), 1024)
    b = prefix.key_of("chat/completions", chat(system, "Write a haiku."), 1024)
    assert a == b
    # Within K characters the first question counts: a conversation keeps its replica.
    short = "Be brief."
    c = prefix.key_of("chat/completions", chat(short, "What is a GPU?"), 1024)
    d = prefix.key_of("chat/completions", chat(short, "Write a haiku."), 1024)
    assert c != d
    # And a later turn of the conversation has the same start as the first.
    turn2 = chat(short, "What is a GPU?")
    turn2["messages"] += [
        {"role": "assistant", "content": "A graphics processor."},
        {"role": "user", "content": "And a TPU?"},
    ]
    assert prefix.prompt_prefix("chat/completions", turn2, 1024).startswith(
        prefix.prompt_prefix("chat/completions", chat(short, "What is a GPU?"), 1024)
    )


def test_the_prefix_is_the_rendered_conversation_roles_and_text_parts_included():
    body = {
        "messages": [
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
            {"role": "assistant", "content": None, "tool_calls": []},
        ]
    }
    text = prefix.prompt_prefix("chat/completions", body, 1024)
    assert text == "system\x1fsys\x1euser\x1flook\ndata:image/png;base64,AAAA\x1eassistant\x1f\x1e"
    # A different role is a different prompt, though the text is the same.
    other = {"messages": [{"role": "user", "content": "sys"}]}
    assert not prefix.prompt_prefix("chat/completions", other, 1024).startswith("system")
    assert prefix.prompt_prefix("chat/completions", body, 10) == text[:10]


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("abcdefghij", "abcdefgh"),
        (["abcdefghij", "zzz"], "abcdefgh"),  # a batch: its first prompt
        ([], ""),
        ([1, 2, 3, 4, 5, 6], "1,2"),  # token ids, about four characters each
        ([[7, 8, 9], [9]], "7,8"),  # a batch of them
    ],
)
def test_a_completion_prompt_counts_its_first_k_characters(prompt, expected):
    assert prefix.prompt_prefix("completions", {"prompt": prompt}, 8) == expected


def test_a_lone_surrogate_in_the_prompt_still_hashes():
    assert isinstance(prefix.key_of("completions", {"prompt": "\ud800 x"}, 64), int)


def test_every_gateway_process_puts_a_prefix_at_the_same_place():
    # Python's own hash() differs per process: owners must not.
    code = (
        "from fleet.gateway import prefix;"
        "print(prefix.key_of('completions', {'prompt': 'shared system prompt'}, 1024))"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert seen == {str(prefix.key_of("completions", {"prompt": "shared system prompt"}, 1024))}


# ---- the ring -----------------------------------------------------------------


def test_each_replica_owns_about_a_third_of_the_prefixes():
    route = route_of("r-a", "r-b", "r-c")
    owners = collections.Counter(route.ring.owner(key(n)).replica_id for n in range(6000))
    assert set(owners) == {"r-a", "r-b", "r-c"}
    assert all(1400 < n < 2600 for n in owners.values()), owners


def test_a_replica_joining_or_leaving_moves_only_about_one_nth_of_the_prefixes():
    three = route_of("r-a", "r-b", "r-c")
    before = {n: three.ring.owner(key(n)).replica_id for n in range(4000)}

    # when: a fourth replica joins
    four = route_of("r-a", "r-b", "r-c", "r-d", old={"m": three})
    after = {n: four.ring.owner(key(n)).replica_id for n in range(4000)}
    moved = [n for n in before if before[n] != after[n]]
    # then: about a quarter move, and every one that moves goes to the newcomer
    assert 700 < len(moved) < 1300
    assert {after[n] for n in moved} == {"r-d"}

    # when: r-b leaves
    two = route_of("r-a", "r-c", old={"m": three})
    left = {n: two.ring.owner(key(n)).replica_id for n in range(4000)}
    # then: only r-b's prefixes move; the others stay where their cache is
    assert all(left[n] == before[n] for n in before if before[n] != "r-b")
    assert {left[n] for n in before if before[n] == "r-b"} == {"r-a", "r-c"}


def test_the_ring_is_kept_while_the_ready_set_is_the_same_and_rebuilt_when_it_changes():
    first = route_of("r-a", "r-b")
    # a refresh that finds the same replicas, in another order
    views = [replica("r-b", shard(port=8001)), replica("r-a", shard(port=8000))]
    again = table.build_routes([ON], views, {"m": first})["m"]
    assert again.ring is first.ring
    changed = route_of("r-a", "r-b", "r-c", old={"m": first})
    assert changed.ring is not first.ring
    assert {u.replica_id for u in changed.ring.members} == {"r-a", "r-b", "r-c"}
    # off: no ring, and picking is least-outstanding as before
    off = table.build_routes([table.ModelView(1, "m", 0, 2)], views)["m"]
    assert off.ring is None


# ---- the choice ---------------------------------------------------------------


def owned_by(route, replica_id: str) -> int:
    return next(key(n) for n in range(1000) if route.ring.owner(key(n)).replica_id == replica_id)


def test_under_even_load_every_request_with_a_prefix_goes_to_its_owner():
    route = route_of("r-a", "r-b", "r-c")
    for n in range(30):
        owner = route.ring.owner(key(n))
        for u in route.upstreams:
            u.outstanding = 2  # everyone equally busy
        up, how = choice.pick_prefix(route, key(n), POLICY)
        assert (up, how) == (owner, prefix.AFFINITY)


def test_a_busy_owner_yields_to_the_next_replica_on_the_ring_then_takes_its_prefix_back():
    route = route_of("r-a", "r-b", "r-c")
    k = owned_by(route, "r-a")
    a, second, third = route.ring.walk(k)
    # given: requests of one prefix arrive while none finishes
    picks = []
    for _ in range(8):
        up, how = choice.pick_prefix(route, k, POLICY)
        up.outstanding += 1
        picks.append((up, how))
    # then: each replica takes what its bounded load allows (1.25 × the average, this
    # request counted), the owner first, then the next on the ring, then the third
    assert picks == [
        (a, prefix.AFFINITY),
        (second, prefix.OVERFLOW),
        (a, prefix.AFFINITY),
        (second, prefix.OVERFLOW),
        (a, prefix.AFFINITY),
        (second, prefix.OVERFLOW),
        (third, prefix.OVERFLOW),
        (a, prefix.AFFINITY),
    ]
    # when: the load evens out again, the prefix goes home
    for u in route.upstreams:
        u.outstanding = 1
    assert choice.pick_prefix(route, k, POLICY) == (a, prefix.AFFINITY)


def test_past_the_margin_the_least_busy_replica_takes_it():
    route = route_of("r-a", "r-b", "r-c")
    k = owned_by(route, "r-a")
    a, b, c = sorted(route.upstreams, key=lambda u: u.replica_id)
    # given: a within its bounded load (1.25 × 61/3, 26) but 15 above c, past a margin of 8
    a.outstanding, b.outstanding, c.outstanding = 25, 25, 10
    assert choice.pick_prefix(route, k, POLICY) == (c, prefix.FALLBACK)
    # 8 above: within the margin, the owner keeps it
    c.outstanding = 17
    assert choice.pick_prefix(route, k, POLICY) == (a, prefix.AFFINITY)
    # a margin of 0: the owner only while none is less busy
    strict = prefix.Policy(load_factor=10, margin=0, max_outstanding=256)
    assert choice.pick_prefix(route, k, strict) == (c, prefix.FALLBACK)


def test_retries_cooling_and_suspect_replicas_are_skipped_as_without_prefixes():
    route = route_of("r-a", "r-b", "r-c")
    k = owned_by(route, "r-a")
    order = list(route.ring.walk(k))
    owner, second, third = order
    # a retry goes on round the ring, never back to a replica it tried
    assert choice.pick_prefix(route, k, POLICY, exclude=[owner]) == (second, prefix.OVERFLOW)
    assert choice.pick_prefix(route, k, POLICY, exclude=[owner, second])[0] is third
    assert choice.pick_prefix(route, k, POLICY, exclude=order) == (None, "")
    # a replica cooling down is passed over
    owner.cooldown_until = float("inf")
    assert choice.pick_prefix(route, k, POLICY)[0] is second
    owner.cooldown_until = 0.0
    # one on a suspect node only when nothing else is left
    owner.suspect = True
    assert choice.pick_prefix(route, k, POLICY)[0] is second
    assert choice.pick_prefix(route, k, POLICY, exclude=[second, third]) == (owner, prefix.AFFINITY)


def test_a_full_replica_is_never_chosen_while_another_has_room():
    route = route_of("r-a", "r-b")
    k = owned_by(route, "r-a")
    a = route.ring.owner(k)
    b = next(u for u in route.upstreams if u is not a)
    a.outstanding, b.outstanding = 4, 1
    tight = prefix.Policy(load_factor=10, margin=100, max_outstanding=4)
    assert choice.pick_prefix(route, k, tight) == (b, prefix.OVERFLOW)
