"""The routing table: which replicas of each model may take a request, and why not.

Built from a snapshot of the database (``load_snapshot``, the only part that
queries) by a pure function (``build_routes``), so the rules — ready replicas
only, never loading, never draining — are tested with tables of cases. The
gateway keeps the result in memory and picks from it per request
(``fleet.gateway.choice``) without touching the database. A replica with a shard on a suspect
node (silent past the grace period: frozen, cut off) stays in the table but is
picked only as a last resort, when no other replica can take the request.
A model with prefix routing on gets a ring over its replicas
(``fleet.gateway.prefix``), kept across refreshes while they stay the same.
"""

from dataclasses import dataclass, field

from fleet.models import DesiredState, NodeState, ReplicaState, ShardState
from fleet.services.readiness import replica_ready, serving_shards

from . import prefix


@dataclass(frozen=True)
class ShardView:
    rank: int
    state: str
    desired_state: str
    node_id: str | None
    mgmt_addr: str
    port: int | None
    node_state: str
    error: str = ""
    adapters: tuple = ()  # what its engine holds, as the agent reported (Shard.adapters)


@dataclass(frozen=True)
class ReplicaView:
    id: str
    model_id: int
    state: str
    reason: str
    served_name: str
    shards: tuple[ShardView, ...]
    profile_id: int = 0
    profile: str = ""  # its name
    engine: str = ""
    max_adapters: int = 0  # its profile's: LoRA adapters it may hold at once


@dataclass(frozen=True)
class ModelView:
    id: int
    name: str
    created: int  # unix seconds, as OpenAI's model objects carry it
    desired_replicas: int
    prefix_routing: bool = False  # requests sharing a prompt prefix go to one replica
    # Autoscaled (min and max replicas set): a request with no ready replica
    # waits for one (fleet.gateway.waiting) instead of a 503 at once.
    autoscaled: bool = False
    sleeps: bool = False  # idle replicas sleep: a request waits for a wake
    max_waiting: int | None = None  # None: the fleet's setting
    max_wait_s: int | None = None
    fallbacks: tuple[str, ...] = ()  # models answering in its stead, in order
    canary_profile_id: int | None = None  # a second profile with canary_percent of requests
    canary_percent: int = 0
    kept_to: tuple[int, str] | None = None  # (team id, name): only its keys call it


@dataclass(frozen=True)
class AdapterView:
    name: str
    model_id: int
    created: int


@dataclass(eq=False)
class Upstream:
    """One ready replica, as the gateway sees it. Kept across refreshes: it holds live counters."""

    replica_id: str
    model: str
    url: str  # http://host:port of the rank-0 shard
    served_name: str
    profile: str = ""  # its engine profile's name, for the metrics by profile
    # Its profile's engine ("vllm", "llamacpp", ...): whether it serves /v1/messages and
    # /v1/responses itself or is sent them as chat completions (fleet.gateway.apis).
    engine: str = ""
    canary: bool = False  # a replica of the model's canary profile
    outstanding: int = 0
    connect_failures: int = 0  # consecutive; reset by any answer
    cooldown_until: float = 0.0  # time.monotonic(); set aside until then
    suspect: bool = False  # a shard is on a suspect node: picked only as a last resort
    engine_waiting: float | None = None  # queued inside the engine, from its /metrics
    batch_outstanding: int = 0  # of ``outstanding``, a batch's lines (fair.batch_refusal)
    metrics_absent_until: float = 0.0  # time.monotonic(); its engine has no /metrics
    # The LoRA adapters its engine holds: name -> what a request for it changes in the
    # body (``adapter_fields``); and those that failed to load: name -> the engine's reason.
    adapters: dict[str, dict] = field(default_factory=dict)
    adapters_failed: dict[str, str] = field(default_factory=dict)
    # What a request for the model itself adds to the body, where the engine needs it
    # told that no adapter applies (``base_fields``); None: nothing.
    base_fields: dict | None = None
    max_adapters: int = 0
    _heads: dict = field(default_factory=dict, repr=False)

    def request_head(self, endpoint: str) -> bytes:
        """The request line and headers, up to the value of Content-Length; built once."""
        head = self._heads.get(endpoint)
        if head is None:
            hostport = self.url.split("://", 1)[-1]
            head = self._heads[endpoint] = (
                f"POST /v1/{endpoint} HTTP/1.1\r\nHost: {hostport}\r\n"
                "Content-Type: application/json\r\nAccept: */*\r\nContent-Length: "
            ).encode()
        return head

    @property
    def address(self) -> tuple[str, int]:
        addr = self._heads.get(None)
        if addr is None:
            host, _, port = self.url.split("://", 1)[-1].rpartition(":")
            addr = self._heads[None] = (host.strip("[]"), int(port))
        return addr


@dataclass(eq=False)
class Route:
    model_id: int
    name: str
    created: int
    upstreams: list[Upstream]
    unavailable: str = ""  # why no replica is ready, for the 503
    retry_after: int = 5
    metrics: object = None
    # With no ready replica: wait for one (autoscaled models, and models that sleep),
    # within these bounds.
    waits: bool = False
    # Replicas asleep or waking when the table was built: a request that waits for
    # one says so in its answer (x-llmgw-woke).
    asleep: int = 0
    max_waiting: int | None = None
    max_wait_s: int | None = None
    fallbacks: tuple[str, ...] = ()
    # The canary's share of requests (0: none); its replicas are upstreams with canary set.
    canary_percent: int = 0
    canary_profile_id: int | None = None
    extra: dict = field(default_factory=dict)
    # Set when the model routes by prompt prefix: a ring over ``upstreams``,
    # rebuilt only when they change (``prefix.Ring``).
    ring: prefix.Ring | None = None
    # A LoRA adapter's route: its base model's name; upstreams are the base's
    # replicas that hold it.
    base: str = ""
    # A model kept to its team's keys (its adapters too): (team id, team name).
    kept_to: tuple[int, str] | None = None


def adapter_fields(engine: str, served: str, name: str, number: int | None) -> dict:
    """What a request for adapter ``name`` changes in the body sent to an engine of
    ``engine`` serving its base as ``served``. vLLM serves an adapter under its own
    name once loaded; SGLang takes its name in ``lora_path`` (as its docs' OpenAI
    example does); llama.cpp's server applies adapters by number, per request."""
    if engine == "llamacpp":  # the others it holds default to 0 when one is named
        return {"model": served, "lora": [{"id": number, "scale": 1.0}], **_NO_CACHE}
    if engine == "sglang":
        return {"model": served, "lora_path": name}
    return {"model": name}


# The order in which a model's unready replicas are described: what will be
# ready soonest first.
_ORDER = [
    "waking",
    "asleep",
    "starting",
    "loading",
    "pending",
    "failed",
    "draining",
    "stopping",
    "unreachable",
]


def replica_status(r: ReplicaView) -> tuple[str, str]:
    """("ready", "") or (what it is instead, a reason an operator can act on).

    Decided by the shards, not the replica's own state, which the reconciler
    may not have caught up on yet.
    """
    if not r.shards:
        return "pending", r.reason
    shards = serving_shards(r.shards)
    if not shards:
        return "stopping", ""
    for s in shards:
        if s.state == ShardState.STOPPED:
            return "stopping", ""
        if s.desired_state == DesiredState.DRAINING or s.state == ShardState.DRAINING:
            return "draining", ""
    # Asleep, going to sleep or waking (docs/operations.md, "Sleep and wake"): a
    # request waits for the wake.
    if any(s.desired_state == DesiredState.ASLEEP for s in shards):
        return "asleep", ""
    if any(s.state == ShardState.ASLEEP for s in shards):
        return "waking", ""
    states = {s.state for s in shards}
    if replica_ready(shards):
        leader = min(shards, key=lambda s: s.rank)
        if leader.rank != 0 or not leader.mgmt_addr or not leader.port:
            return "unreachable", "its rank-0 shard has no address"
        if leader.node_state == NodeState.LOST:
            return "unreachable", f"node {leader.node_id} is lost"
        return "ready", ""
    if ShardState.FAILED in states:
        err = r.reason or next((s.error for s in shards if s.error), "")
        return "failed", (err.strip().splitlines() or [""])[0]
    if ShardState.PENDING in states:
        return "pending", r.reason
    if ShardState.STARTING in states:
        return "starting", ""
    if ShardState.LOADING in states:
        return "loading", ""
    # An unknown state from a newer agent is never guessed healthy.
    return "failed", f"unknown shard state {sorted(states)}"


def upstream_url(addr: str, port: int) -> str:
    host = f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
    return f"http://{host}:{port}"


def describe_unready(counts: dict[tuple[str, str], int], desired: int) -> tuple[str, int]:
    """The 503's reason ("1 loading; 1 pending: gpu-07 ...") and its Retry-After."""
    if not counts:
        return (
            "no replica is placed" if desired else "it is scaled to 0 replicas",
            30,
        )
    parts = []
    for (what, reason), n in sorted(
        counts.items(), key=lambda kv: (_ORDER.index(kv[0][0]), kv[0][1])
    ):
        parts.append(f"{n} {what}: {reason}" if reason else f"{n} {what}")
    soon = any(what in ("starting", "loading", "waking", "asleep") for what, _ in counts)
    return "; ".join(parts), (5 if soon else 30)


def build_routes(
    models: list[ModelView],
    replicas: list[ReplicaView],
    old: dict[str, Route] | None = None,
    adapters: list[AdapterView] = (),
) -> dict[str, Route]:
    """The table, by served model name. Upstreams of ``old`` are reused so counters survive."""
    previous: dict[tuple[str, str], Upstream] = {}
    for route in (old or {}).values():
        for u in route.upstreams:
            previous[(u.replica_id, u.url)] = u
    by_model: dict[int, list[ReplicaView]] = {}
    for r in replicas:
        by_model.setdefault(r.model_id, []).append(r)
    table = {}
    for m in models:
        upstreams = []
        counts: dict[tuple[str, str], int] = {}
        for r in by_model.get(m.id, []):
            if r.state == ReplicaState.STOPPED:
                continue
            what, reason = replica_status(r)
            if what != "ready":
                counts[(what, reason)] = counts.get((what, reason), 0) + 1
                continue
            leader = min(serving_shards(r.shards), key=lambda s: s.rank)
            url = upstream_url(leader.mgmt_addr, leader.port)
            u = previous.get((r.id, url)) or Upstream(r.id, m.name, url, r.served_name)
            u.served_name, u.profile, u.engine = r.served_name, r.profile, r.engine
            u.adapters, u.adapters_failed = _held(r, leader)
            u.base_fields = base_fields(
                r.engine, [a for a in leader.adapters if isinstance(a, dict)]
            )
            u.max_adapters = r.max_adapters
            u.canary = r.profile_id == m.canary_profile_id
            u.suspect = any(s.node_state == NodeState.SUSPECT for s in serving_shards(r.shards))
            upstreams.append(u)
        route = Route(m.id, m.name, m.created, upstreams, kept_to=m.kept_to)
        if m.prefix_routing and upstreams:
            _ring(route, old)
        route.asleep = sum(n for (what, _), n in counts.items() if what in ("asleep", "waking"))
        route.waits, route.max_waiting, route.max_wait_s, route.fallbacks = (
            m.autoscaled or bool(route.asleep) or (m.sleeps and m.desired_replicas > 0),
            m.max_waiting,
            m.max_wait_s,
            m.fallbacks,
        )
        if m.canary_profile_id is not None:
            route.canary_percent = m.canary_percent
            route.canary_profile_id = m.canary_profile_id
        if not upstreams:
            reason, route.retry_after = describe_unready(counts, m.desired_replicas)
            route.unavailable = f"model '{m.name}' has no ready replica: {reason}"
        table[m.name] = route
    by_id = {m.id: m for m in models} if adapters else {}
    for a in adapters:
        base = by_id.get(a.model_id)
        if base is not None and base.name in table:
            table[a.name] = _adapter_route(a, base, table[base.name], old)
    return table


def _ring(route: Route, old: dict[str, Route] | None) -> None:
    # Rebuilt only when the ready set changed: a refresh that found the
    # same replicas keeps the ring it had.
    before = (old or {}).get(route.name)
    ring = before.ring if before is not None else None
    if ring is None or not ring.same_members(route.upstreams):
        ring = prefix.Ring(route.upstreams)
    route.ring = ring


# llama.cpp's server reuses a prompt's cached KV across requests for other adapters, and
# the answer is then partly the previous adapter's (ggml-org/llama.cpp#26207, open; seen
# on the pinned build): a replica holding adapters gets every request without the cache.
_NO_CACHE = {"cache_prompt": False}


def base_fields(engine: str, held: list[dict]) -> dict | None:
    """What a request for the base model adds for an engine holding adapters ``held``.
    llama.cpp's server applies its adapters at its own scales to a request that names
    none, so each is named at 0."""
    numbers = [a.get("id") for a in held if a.get("state") == "loaded" and a.get("id") is not None]
    if engine != "llamacpp" or not numbers:
        return None
    return {"lora": [{"id": n, "scale": 0.0} for n in sorted(numbers)], **_NO_CACHE}


def _held(r: ReplicaView, leader: ShardView) -> tuple[dict[str, dict], dict[str, str]]:
    loaded, failed = {}, {}
    for a in leader.adapters:
        if not isinstance(a, dict) or not a.get("name"):
            continue
        if a.get("state") == "loaded":
            loaded[a["name"]] = adapter_fields(r.engine, r.served_name, a["name"], a.get("id"))
        elif a.get("state") == "failed":
            failed[a["name"]] = a.get("error") or "it failed to load"
    return loaded, failed


def _adapter_route(a: AdapterView, m: ModelView, base: Route, old) -> Route:
    """An adapter's route: the base's ready replicas that hold it. With none, a request
    waits (within the base's bounds) while a replica loads it, unless none can."""
    holders = [u for u in base.upstreams if a.name in u.adapters]
    route = Route(m.id, a.name, a.created, holders, base=m.name, kept_to=m.kept_to)
    route.max_waiting, route.max_wait_s = m.max_waiting, m.max_wait_s
    if m.prefix_routing and holders:
        _ring(route, old)
    if holders:
        route.waits = True
        return route
    what = f"adapter '{a.name}' of model '{m.name}'"
    if not base.upstreams:
        # A replica starting (llama.cpp restarts to change its adapters) is waited for.
        route.waits, route.retry_after = base.waits or base.retry_after == 5, base.retry_after
        route.unavailable = f"{what} has no ready replica: " + base.unavailable.split(": ", 1)[-1]
    elif not any(u.max_adapters for u in base.upstreams):
        route.unavailable = (
            f"{what} cannot be served: the replicas of '{m.name}' hold no adapters "
            "(their profile's max_adapters is 0)"
        )
    elif all(a.name in u.adapters_failed for u in base.upstreams):
        reason = next(u.adapters_failed[a.name] for u in base.upstreams)
        route.unavailable = f"{what} failed to load: {reason}"
    else:
        route.waits, route.retry_after = True, 5
        route.unavailable = f"{what} is not loaded on a ready replica yet"
    return route


def load_snapshot() -> tuple[list[ModelView], list[ReplicaView], list[AdapterView]]:
    """Read what the table is built from: four queries, whatever the fleet's size."""
    from fleet.models import Adapter, Model, Replica, Shard

    models = [
        ModelView(
            pk,
            name,
            int(created.timestamp()),
            desired,
            prefix_routing=prefix_routing,
            autoscaled=lo is not None and hi is not None,
            sleeps=sleep_after is not None,
            max_waiting=max_waiting,
            max_wait_s=max_wait_s,
            fallbacks=tuple(fallbacks or ()),
            canary_profile_id=canary,
            canary_percent=percent,
            kept_to=(team_id, team) if private and team_id is not None else None,
        )
        for (
            pk,
            name,
            created,
            desired,
            prefix_routing,
            lo,
            hi,
            max_waiting,
            max_wait_s,
            fallbacks,
            canary,
            percent,
            private,
            team_id,
            team,
            sleep_after,
        ) in (
            Model.objects.values_list(
                "pk",
                "name",
                "created_at",
                "desired_replicas",
                "prefix_routing",
                "min_replicas",
                "max_replicas",
                "max_waiting",
                "max_wait_s",
                "fallbacks",
                "canary_profile_id",
                "canary_percent",
                "private",
                "team_id",
                "team__name",
                "sleep_after_s",
            )
        )
    ]
    shards: dict[str, list[ShardView]] = {}
    for row in (
        Shard.objects.exclude(replica__state=ReplicaState.STOPPED)
        .values_list(
            "replica_id",
            "rank",
            "state",
            "desired_state",
            "node_id",
            "node__mgmt_addr",
            "port",
            "node__state",
            "error",
            "adapters",
        )
        .iterator()
    ):
        rid, rank, state, desired, node_id, addr, port, node_state, error, held = row
        shards.setdefault(rid, []).append(
            ShardView(
                rank, state, desired, node_id, addr or "", port, node_state or "", error,
                tuple(held or ()),
            )
        )  # fmt: skip
    replicas = [
        ReplicaView(
            pk, model_id, state, reason, served or model_name, tuple(shards.get(pk, ())),
            profile_id, profile, engine, max_adapters,
        )
        for pk, model_id, state, reason, served, model_name, profile_id, profile, engine,
        max_adapters in (
            Replica.objects.exclude(state=ReplicaState.STOPPED).values_list(
                "pk", "model_id", "state", "reason", "profile__served_model_name", "model__name",
                "profile_id", "profile__name", "profile__engine", "profile__max_adapters",
            )
        )
    ]  # fmt: skip
    adapters = [
        AdapterView(name, model_id, int(created.timestamp()))
        for name, model_id, created in Adapter.objects.values_list("name", "model_id", "created_at")
    ]
    return models, replicas, adapters
