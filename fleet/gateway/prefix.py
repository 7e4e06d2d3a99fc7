"""Prefix-aware routing: requests that share a prompt prefix go to the replica that has it cached.

Engines keep the KV cache of prompts they have seen (vLLM's and SGLang's prefix
caches, llama.cpp's slots and prompt cache), so a request whose long system
prompt a replica processed a moment ago starts generating there sooner. For a
model with ``prefix_routing`` on, the gateway hashes the start of each prompt
(``key_of``) and looks the hash up on a consistent-hash ring over the model's
ready replicas (``Ring``): one replica owns each prefix, and a replica joining
or leaving moves only the prefixes it owns or takes, about 1/N of them.

The owner takes the request while it is not overloaded (``choose``): a replica
whose outstanding requests would exceed ``load_factor`` × the average is passed
over for the next replica on the ring (bounded-load consistent hashing, after
Mirrokni, Thorup and Zadimoghaddam), so a hot prefix spills onto a second
replica rather than queueing on one. And when the chosen replica has more than
``margin`` requests in flight beyond the least busy one, the request goes to the
least busy one instead, as without prefix routing.

Everything here is pure and per request cheap: one hash of at most
``chars`` characters of the already-parsed body, one binary search. The ring is
built when the set of ready replicas changes (``table.build_routes``), and its
hash does not depend on the process, so every gateway process agrees on owners.
"""

import bisect
import hashlib
import math
from dataclasses import dataclass

# Points per replica on the ring: enough that each owns close to 1/N of the
# keys (the spread shrinks as 1/sqrt(points)), few enough that a ring builds in
# a few milliseconds, once per change of the ready set.
VNODES = 160

# What ``choose`` says it did, the label of llmgw_gateway_prefix_routes_total.
AFFINITY = "affinity"  # the prefix's own replica
OVERFLOW = "overflow"  # the next one on the ring: the owner was over its bounded load
FALLBACK = "fallback"  # the least busy replica: the ring's choice was over the margin


def _hash64(data: bytes) -> int:
    # blake2b rather than hash(): the same on every gateway process and machine,
    # whatever PYTHONHASHSEED says. Eight bytes is plenty for a ring.
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _content_text(content) -> str:
    """A message's content as text: a string, or the text (and image URLs) of its parts."""
    if content.__class__ is str:
        return content
    if content.__class__ is list:
        out = []
        for part in content:
            if part.__class__ is dict:
                text = part.get("text")
                if text.__class__ is str:
                    out.append(text)
                else:
                    image = part.get("image_url")
                    url = image.get("url") if image.__class__ is dict else image
                    if url.__class__ is str:
                        out.append(url)
        return "\n".join(out)
    return ""


def prompt_prefix(endpoint: str, body: dict, chars: int) -> str:
    """The first ``chars`` characters of the prompt, as the engine will see it begin.

    Chat: the messages in order, each as its role and its content, as a chat
    template renders them: the system prompt first, then the first turns.
    Completions: the prompt; for a batch, its first prompt; token ids as text.
    """
    if endpoint == "chat/completions":
        out = []
        left = chars
        for m in body["messages"]:
            content = m.get("content")
            text = content if content.__class__ is str else _content_text(content)
            piece = f"{m['role']}\x1f{text[:left]}\x1e"
            out.append(piece)
            left -= len(piece)
            if left <= 0:
                break
        return "".join(out)[:chars]
    prompt = body.get("prompt")
    if prompt.__class__ is list:
        first = prompt[0] if prompt else ""
        if first.__class__ is str:  # a batch of prompts
            prompt = first
        else:  # token ids, or a batch of them
            ids = first if first.__class__ is list else prompt
            # About four characters a token: roughly the same span of prompt.
            return ",".join(str(t) for t in ids[: max(1, chars // 4)])
    return prompt[:chars] if prompt.__class__ is str else str(prompt)[:chars]


def key_of(endpoint: str, body: dict, chars: int) -> int:
    """The prefix's position on the ring."""
    return _hash64(prompt_prefix(endpoint, body, chars).encode("utf-8", "surrogatepass"))


class Ring:
    """A consistent-hash ring over a model's ready replicas (``table.Upstream``s).

    Points depend on replica ids alone, never on their order or the process.
    """

    __slots__ = ("members", "_points", "_owners")

    def __init__(self, upstreams, vnodes: int = VNODES):
        self.members = tuple(upstreams)
        points = []
        for i, u in enumerate(self.members):
            name = u.replica_id.encode()
            for v in range(vnodes):
                points.append((_hash64(name + b"#" + str(v).encode()), i))
        points.sort()
        self._points = [p for p, _ in points]
        self._owners = [i for _, i in points]

    def same_members(self, upstreams) -> bool:
        """Whether ``upstreams`` are this ring's replicas, the very objects, in any order."""
        return len(upstreams) == len(self.members) and {id(u) for u in upstreams} == {
            id(u) for u in self.members
        }

    def owner(self, key: int):
        """The replica that owns ``key``: the one at the first point at or after it."""
        points = self._points
        return self.members[self._owners[bisect.bisect_left(points, key) % len(points)]]

    def walk(self, key: int):
        """Each replica once, in ring order from ``key``: the owner first, then who takes over."""
        n = len(self.members)
        points, owners = self._points, self._owners
        if not points:
            return
        at = bisect.bisect_left(points, key)
        seen = set()
        size = len(points)
        for step in range(size):
            i = owners[(at + step) % size]
            if i not in seen:
                seen.add(i)
                yield self.members[i]
                if len(seen) == n:
                    return


@dataclass(frozen=True)
class Policy:
    load_factor: float  # a replica takes a prefix's request up to this × the average load
    margin: int  # ... and while it has at most this many more in flight than the least busy
    max_outstanding: int  # a replica with this many in flight is full (the 429 bound)


def choose(ring: Ring, key: int, available: list, policy: Policy):
    """(replica, result) for a request whose prefix hashes to ``key``; (None, "") when none.

    ``available``: the replicas that may take it now (not already tried, not
    cooling down), the suspect ones only when nothing else is left, as
    ``choice.pick`` offers them. The average counts this request too, so an idle
    fleet's owner always takes it.
    """
    if not available:
        return None, ""
    total = 0
    least = None
    for u in available:
        total += u.outstanding
        if least is None or u.outstanding < least:
            least = u.outstanding
    capacity = math.ceil(policy.load_factor * (total + 1) / len(available))
    capacity = min(capacity, policy.max_outstanding)
    # The common case first, without walking: the owner is there and has room.
    owner = ring.owner(key)
    if owner.outstanding < capacity and owner in available:
        if owner.outstanding - least > policy.margin:
            return None, FALLBACK
        return owner, AFFINITY
    for u in ring.walk(key):
        if u is not owner and u.outstanding < capacity and u in available:
            if u.outstanding - least > policy.margin:
                return None, FALLBACK
            return u, OVERFLOW
    # Everyone over the bound (all full, say): the least busy, as without prefixes.
    return None, FALLBACK
