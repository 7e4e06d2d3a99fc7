"""Which weights go: facts in, proposals and their reasons out. No database, no clock.

An entry is *unused* when no desired or running shard on its node needs it
(``fleet.services.weight_names``); an entry on a shared filesystem is one
copy for every node that sees it, unused only when no shard on any node
needs it. An unused entry goes when it has been unused longer than its
retention (the fleet's, or its model's), or, on a filesystem past the high
watermark, least recently used first until the filesystem would be under the
low one. A pinned entry never goes; one whose removal is already under way,
or that its node kept a short while ago, is not proposed again yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from fleet.services.weight_names import Wanted, names


class Entry(NamedTuple):
    """One weights entry as a pass sees it (times are unix seconds). A tuple: a pass
    makes one per entry of the fleet, 100,000 of them at 5,000 nodes."""

    id: int
    node_id: str
    path: str
    size_bytes: int
    source: str = ""
    shared: bool = False
    pinned: bool = False
    last_used: float | None = None  # the node's word: when an engine last used it
    unused_since: float | None = None  # the control plane's: since when nothing needed it
    remove_requested: bool = False  # an operator asked for it to go now
    busy: bool = False  # a removal is under way, or the node kept it a short while ago


@dataclass(frozen=True)
class Filesystem:
    """A filesystem a node watches (a Storage row); shared ones count once."""

    node_id: str
    path: str
    free_bytes: int
    total_bytes: int
    shared: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return ("", self.path) if self.shared else (self.node_id, self.path)

    @property
    def used_percent(self) -> float:
        return 100.0 * (self.total_bytes - self.free_bytes) / self.total_bytes


@dataclass(frozen=True)
class Policy:
    retention_s: float = 24 * 3600.0
    high_percent: float = 85.0
    low_percent: float = 75.0
    # Models' own retentions: (a model_path of one of their profiles, seconds).
    overrides: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Proposal:
    entry: Entry
    reason: str


@dataclass
class Decision:
    proposals: list[Proposal] = field(default_factory=list)
    # Bookkeeping for the pass: entries that stopped or started being needed.
    became_unused: list[int] = field(default_factory=list)
    became_used: list[int] = field(default_factory=list)
    # Operators' requests that cannot be honoured: (entry, why).
    refused: list[tuple[Entry, str]] = field(default_factory=list)
    # Operators' requests left standing for a later pass: (entry, why not now).
    waiting: list[tuple[Entry, str]] = field(default_factory=list)


def hours(seconds: float) -> str:
    if seconds >= 3600:
        h = seconds / 3600
        return f"{h:.0f} h" if h >= 10 or h == int(h) else f"{h:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _last_use(e: Entry) -> float:
    """The later of the node's last use and the control plane's; never seen: oldest."""
    return max(e.last_used or 0.0, e.unused_since or 0.0)


def _filesystem_of(path: str, filesystems: list[Filesystem]) -> Filesystem | None:
    best = None
    for fs in filesystems:
        root = fs.path.rstrip("/")
        if (path == root or path.startswith(root + "/")) and (
            best is None or len(root) > len(best.path.rstrip("/"))
        ):
            best = fs
    return best


class _Retention:
    def __init__(self, policy: Policy):
        self.default = policy.retention_s
        self.by_name: dict[str, float] = {}
        for model_path, seconds in policy.overrides:
            for key in (model_path, model_path.strip("/")):
                # Two models naming the same weights: the longer retention wins.
                self.by_name[key] = max(seconds, self.by_name.get(key, 0.0))

    def of(self, e: Entry) -> float:
        if not self.by_name:
            return self.default
        found = [self.by_name[k] for k in names(e.path) if k in self.by_name]
        if e.source and e.source in self.by_name:
            found.append(self.by_name[e.source])
        return max(found) if found else self.default


def select(
    entries: list[Entry],
    needed: dict[str, Wanted],
    filesystems: list[Filesystem],
    connected: set[str],
    now: float,
    policy: Policy,
) -> Decision:
    """What goes now, and why.

    ``needed`` maps a node to the model paths of its desired or running shards;
    ``connected`` names the nodes a proposal can reach now (others wait).
    Shared entries are judged once per path, proposed to one connected node
    that sees them.

    It runs over every entry of the fleet each pass (100,000 at 5,000 nodes),
    so the common case, an entry judged and left alone, costs a few operations.
    """
    out = Decision()
    everywhere = Wanted()
    for wanted in needed.values():
        for p in wanted.exact:
            everywhere.add(p)
    full = _full(filesystems, policy)
    full_nodes = {fs.node_id for fs in filesystems if fs.key in full}
    retention = _Retention(policy)
    by_name = retention.by_name
    default_keep = retention.default
    # Nothing unused for less than the shortest retention can go by retention.
    shortest = min([default_keep, *by_name.values()])
    became_used, became_unused = out.became_used, out.became_unused
    proposals = out.proposals
    proposed: set[int] = set()
    pool: list[Entry] = []  # unused, removable, not yet proposed: watermark candidates
    requested: list[Entry] = []
    shared: dict[str, list[Entry]] = {}

    def judge(e: Entry) -> None:
        """An unused entry (a shared one merged): proposed, a watermark candidate, or left."""
        if e.pinned:
            if e.remove_requested:
                out.refused.append((e, "pinned"))
            return
        if e.busy or e.node_id not in connected:
            return
        if e.remove_requested:
            proposals.append(Proposal(e, "an operator asked to remove it"))
            proposed.add(e.id)
            return
        since = e.unused_since
        if since is None:
            since = now
        last = e.last_used
        idle = now - (since if last is None or last < since else last)
        if idle > shortest:
            keep_s = retention.of(e) if by_name else default_keep
            if idle > keep_s:
                proposals.append(
                    Proposal(e, f"unused for {hours(idle)} (retention {hours(keep_s)})")
                )
                proposed.add(e.id)
                return
        if e.node_id in full_nodes:
            pool.append(e)

    # The common case inline: a local entry, unused, not asked for, idle for less
    # than the shortest retention, on a filesystem with room: nothing to do.
    for e in entries:
        if e.shared:
            shared.setdefault(e.path, []).append(e)
            continue
        wanted = needed.get(e.node_id)
        if wanted is not None and wanted.serves(e.path, e.source):
            if e.unused_since is not None:
                became_used.append(e.id)
            if e.remove_requested:
                requested.append(e)
            continue
        since = e.unused_since
        if since is None:
            became_unused.append(e.id)
        elif not e.remove_requested and now - since <= shortest and e.node_id not in full_nodes:
            continue  # idle for less than any retention (the node's last use is later still)
        if e.remove_requested:
            requested.append(e)
        judge(e)
    for rows in shared.values():
        first = rows[0]
        requested += [e for e in rows if e.remove_requested]
        used = everywhere.serves(first.path, first.source)
        for e in rows:
            if used and e.unused_since is not None:
                became_used.append(e.id)
            elif not used and e.unused_since is None:
                became_unused.append(e.id)
        if used:
            continue
        reachable = [e for e in rows if e.node_id in connected] or rows
        chosen = min(reachable, key=lambda e: e.node_id)
        judge(
            chosen._replace(
                shared=True,
                pinned=any(e.pinned for e in rows),
                last_used=max((e.last_used or 0.0 for e in rows), default=0.0) or None,
                unused_since=max((e.unused_since or 0.0 for e in rows), default=0.0) or None,
                remove_requested=any(e.remove_requested for e in rows),
                busy=any(e.busy for e in rows),
            )
        )

    # Operators asked for entries that are not proposed now: say why, each one.
    if requested:
        _unproposed(out, requested, proposed, needed, everywhere, connected, shared)

    if pool:
        _watermarks(out, pool, filesystems, full, policy)
    return out


def _unproposed(
    out: Decision,
    requested: list[Entry],
    proposed: set[int],
    needed: dict[str, Wanted],
    everywhere: Wanted,
    connected: set[str],
    shared: dict[str, list[Entry]],
) -> None:
    """Refused (in use, pinned) or left standing (a removal under way, the node
    away): the operator's answer names every entry it asked for."""
    said = {e.id for e, _ in out.refused}
    # A shared path is judged once, as one of its rows: the others share its fate.
    shared_proposed = {p.entry.path for p in out.proposals if p.entry.shared}
    shared_said = {e.path for e, _ in out.refused if e.shared}
    for e in requested:
        if e.id in proposed or e.id in said:
            continue
        if e.shared and (e.path in shared_proposed or e.path in shared_said):
            continue
        if e.pinned:
            out.refused.append((e, "pinned"))
            continue
        if needed.get(e.node_id, Wanted()).serves(e.path, e.source) or (
            e.shared and everywhere.serves(e.path, e.source)
        ):
            out.refused.append((e, "in use by a shard that is desired or running there"))
            continue
        copies = shared.get(e.path, [e]) if e.shared else [e]
        if any(c.busy for c in copies):
            # Marking a request clears "kept a moment ago" on every copy of its path
            # (inventory.request_removal): busy is a removal under way.
            out.waiting.append((e, "a removal of it is already under way"))
        elif not any(c.node_id in connected for c in copies):
            out.waiting.append((e, "its node is not connected: proposed when it is back"))


def _full(filesystems: list[Filesystem], policy: Policy) -> dict[tuple, Filesystem]:
    """Filesystems past the high watermark, by key (a shared one once)."""
    full: dict[tuple, Filesystem] = {}
    for fs in filesystems:
        if fs.total_bytes > 0 and fs.used_percent > policy.high_percent:
            full.setdefault(fs.key, fs)
    return full


def _watermarks(
    out: Decision,
    pool: list[Entry],
    filesystems: list[Filesystem],
    full: dict[tuple, Filesystem],
    policy: Policy,
) -> None:
    by_node: dict[str, list[Filesystem]] = {}
    for fs in filesystems:
        if fs.key in full:
            by_node.setdefault(fs.node_id, []).append(fs)
    going: dict[tuple, list[Entry]] = {}
    freed: dict[tuple, int] = {}
    for p in out.proposals:  # what retention already removes counts first
        fs = _filesystem_of(p.entry.path, by_node.get(p.entry.node_id, []))
        if fs is not None:
            freed[fs.key] = freed.get(fs.key, 0) + p.entry.size_bytes
    for e in pool:
        fs = _filesystem_of(e.path, by_node.get(e.node_id, []))
        if fs is not None:
            going.setdefault(fs.key, []).append(e)
    for key, lst in going.items():
        fs = full[key]
        target = fs.total_bytes * policy.low_percent / 100.0
        used = fs.total_bytes - fs.free_bytes - freed.get(key, 0)
        lst.sort(key=lambda e: (_last_use(e), -e.size_bytes, e.path))
        for e in lst:
            if used < target:
                break
            out.proposals.append(
                Proposal(
                    e,
                    f"{fs.path} is {fs.used_percent:.0f}% full (high watermark "
                    f"{policy.high_percent:g}%): least recently used, until under "
                    f"{policy.low_percent:g}%",
                )
            )
            used -= e.size_bytes
