"""The fleet's settings, declared once and read as typed attributes.

Each setting is a field below: its type, its default, its unit in its name
(seconds unless it says otherwise) and, in its comment, what it does. Each is
read from the environment variable ``LLMGW_<NAME>`` by ``from_environ()``,
which llmgw_site/settings.py stores as ``settings.LLMGW``; code reads them
with ``fleet_settings().suspect_after_s``, never by string key, so a typo is
an AttributeError rather than a KeyError at three in the morning.

Tests override a setting the Django way (``settings.LLMGW = {**settings.LLMGW,
"LOGS_TIMEOUT_S": 0.3}``); ``fleet_settings()`` sees the new dict at once.
docs/operations.md lists them for operators.
"""

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentd.ports import DEFAULT_PORT_RANGE, format_port_range


def _engines(text: str) -> dict[str, str]:
    """``"vllm=0.11.0,llamacpp=0.3.16"`` as {engine: version}."""
    wanted = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        engine, sep, version = part.partition("=")
        if not sep or not engine.strip() or not version.strip():
            raise ValueError(f"'{part}' is not ENGINE=VERSION, e.g. vllm=0.11.0")
        wanted[engine.strip()] = version.strip()
    return wanted


@dataclass(frozen=True)
class FleetSettings:
    # Agents.
    heartbeat_interval_s: float = 10.0  # how often agents are told to send a heartbeat
    # Heartbeats that arrive while a write runs go together in the next one
    # (fleet/services/heartbeat/batching.py); this is an extra wait before each
    # write, for bigger batches at the price of latency. 0: none. 50 ms took
    # the web process's CPU per heartbeat from 2.1 to 1.2 ms at 1,000 agents
    # (fewer trips to the writer thread and statements per heartbeat; the ack
    # comes ~40 ms later: docs/benchmarks.md, Agent sockets).
    heartbeat_flush_s: float = 0.05
    # Threads (each with its own database connection) a web process runs its
    # agent sockets' database calls on (fleet/sockets/db.py): that many
    # registrations overlap their round trips. SQLite takes one writer at a
    # time, so there it is always 1.
    agent_db_threads: int = 4
    # Agent sockets one web process takes between the knock and the register's
    # ack at a time (fleet/sockets/admission.py); the next is answered 503 with
    # a Retry-After at once, not queued past the agent's 10 s handshake wait
    # (after a restart the whole fleet knocks together). 0: no limit.
    agent_handshakes_max: int = 256
    logs_timeout_s: float = 10.0  # how long a log request waits for the agent's reply
    # Engines every node should have, ENGINE=VERSION separated by commas, used
    # while no WantedEngine rows exist (fleet.services.engines; docs/engines.md).
    # Sent to each agent as a provision message. Empty: none.
    engines: dict[str, str] = field(default_factory=dict)
    # What one agent socket may send (token buckets, fleet/sockets/metering.py): a
    # sustained rate and a burst saved up, in messages and in bytes; past either
    # the socket is closed with 4029. A healthy agent sends a heartbeat every
    # 10 s, a burst at registration and on shard changes, and a log reply (up
    # to 1 MiB) when asked. A rate of 0: no limit.
    agent_messages_per_s: float = 20.0
    agent_messages_burst: int = 500
    agent_bytes_per_s: float = 128 * 1024
    agent_bytes_burst: int = 8 << 20  # at least one message of 1 MiB, Daphne's limit
    # Networks (CIDRs, separated by commas) a node's mgmt_addr must be in: the
    # gateway connects there. Empty: any unicast address, loopback only from an
    # agent on this machine (fleet.services.access.mgmt_addr_refusal).
    agent_addr_networks: str = ""
    # The memory estimate before placement (fleet/services/estimate.py) reads the
    # headers of the weights a profile names. Local paths only under these
    # directories of the control plane's machine (comma-separated; empty: none),
    # and https:// sources only from public addresses and these networks (CIDRs),
    # as nodes fetch (docs/security.md): a profile's author cannot make the control
    # plane read its own files or probe its network.
    estimate_dirs: str = ""
    estimate_allow_networks: str = ""
    # Node identity by client certificate (docs/security.md): addresses or
    # networks (separated by commas) of the TLS-terminating proxies that verify
    # each agent's certificate and pass its CN in X-LLMGW-Client-CN. Set, every
    # agent socket must come from one of them (the connection's own address,
    # never X-Forwarded-For) with a CN equal to the node id it registers as, on
    # top of its node credential. Empty: off, and the header is never read.
    client_cert_proxies: str = ""
    # A connected node whose acknowledged desired version has been behind the
    # desired one, without progress, for longer than this is "not keeping up"
    # (fleet.services.desired.not_keeping_up): shown in the admin, the API and
    # /metrics. The seed's bounded command queue said the same when it filled.
    desired_lag_bound_s: float = 30.0

    # The reconciler (fleet.services.reconciler; docs/operations.md).
    reconcile_interval_s: float = 5.0  # beat's interval, and the expiry of each entry
    suspect_after_s: float = 50.0  # silence after which a node gets no new placements
    replace_after_s: float = 300.0  # silence after which its replicas are replaced
    replace_every_s: float = 10.0  # at most one lost node's replicas replaced per this
    # No pass for this long means the control plane (or its database or Redis)
    # was down: every node gets a full grace period again.
    outage_gap_s: float = 30.0
    restart_backoff_s: float = 10.0  # first restart delay after a failure; doubles
    restart_backoff_max_s: float = 300.0
    failures_before_moving: int = 3  # failed starts on a node before others go first
    fetch_stall_s: float = 120.0  # a start still receiving fetch progress is not hung
    drain_timeout_s: float = 60.0  # in-flight requests' time before a drained shard stops
    # An operator's drain of one replica waits this long for its replacement to be
    # ready, then drains it anyway (said in the event).
    replica_drain_wait_s: float = 600.0
    # GPU faults and notices (fleet.services.gpu_health; docs/operations.md). A failed
    # GPU's replicas are moved away as an operator's drain is, waiting for their
    # replacements this long at most (its engine is likely dead already).
    gpu_drain_wait_s: float = 120.0
    # The mass-failure brake for GPUs: at most this share of the fleet's GPUs (at least
    # one) drained for failures per window; more failing at once is likelier a driver
    # or firmware fault, and their replicas stay until an operator looks.
    gpu_failure_brake: float = 0.25
    gpu_brake_window_s: float = 600.0
    # A node's notice: what runs there is drained this long before its deadline
    # whether or not its replacement is ready, so requests in flight can finish.
    notice_drain_s: float = 30.0
    # GPU memory never promised to shares of a GPU (profiles with gpu_memory_gb):
    # the driver's and CUDA contexts' own, and headroom.
    gpu_memory_reserve_gb: float = 1.0
    # Replicas drained to make room for a higher priority, at most this many in any
    # minute (0: never). None while the mass-failure brake is on.
    preemptions_per_minute: int = 2
    # Ports engines listen on, per node; a node label llmgw.io/ports=LO-HI overrides.
    shard_port_range: str = format_port_range(DEFAULT_PORT_RANGE)

    # The audit trail (fleet/audit.py): entries older than this many days are
    # removed once a day. 0: kept for ever.
    audit_retention_days: int = 365

    # Cleaning up unused weights (fleet.services.weights_gc; docs/weights.md).
    weights_gc_interval_s: float = 60.0  # beat's interval for the clean-up pass
    # How long weights nothing on a node needs stay there; a model's
    # weights_retention_s overrides it, and a pinned entry stays forever.
    weights_retention_s: float = 24 * 3600.0
    # A filesystem more used than the high watermark (percent) has its least
    # recently used unused weights removed until it is under the low one.
    weights_high_watermark_percent: float = 85.0
    weights_low_watermark_percent: float = 75.0
    # How long a removal on a node's socket waits for the node's reply; until
    # then no shard needing those weights is placed there. Past it the entry
    # may be proposed again.
    weights_removal_timeout_s: float = 60.0
    # An entry the node kept (in use, changed) is not proposed again for this long.
    weights_kept_retry_s: float = 3600.0
    weights_events_keep_s: float = 30 * 24 * 3600.0  # how long removal events are kept

    # The operator's console (fleet/console/; docs/operations.md, "The console").
    # Prometheus to read node charts from (query_range on the llmgw_* series),
    # e.g. http://prometheus:9090. Empty: charts read the control plane's own
    # bounded history, kept from heartbeats in Redis (fleet/services/history.py).
    prometheus_url: str = ""
    prometheus_timeout_s: float = 5.0  # one query_range; a page is waiting for it
    # The history keeps at most one point per node per this many seconds, for an hour.
    history_step_s: float = 15.0

    # The gateway (/v1/*; docs/gateway.md).
    # Request bodies: a larger one is refused with 413 before it is read, from
    # Content-Length or as it streams. This one is chat's (images travel inline)
    # and the ceiling of the others.
    gateway_max_body_bytes: int = 16 << 20
    gateway_completions_max_body_bytes: int = 4 << 20  # /v1/completions
    gateway_embeddings_max_body_bytes: int = 8 << 20  # /v1/embeddings
    gateway_connect_timeout_s: float = 3.0
    # Until the engine's response headers: a long non-streamed generation sends
    # nothing before it is complete, so this is generous.
    gateway_first_byte_timeout_s: float = 300.0
    gateway_total_timeout_s: float = 1800.0
    # Safety refreshes of the in-memory routing table and keys, in case a
    # doorbell was lost: the keys' interval bounds how long a revocation takes.
    gateway_refresh_s: float = 5.0
    gateway_keys_refresh_s: float = 2.0
    gateway_last_used_flush_s: float = 10.0
    gateway_max_retries: int = 2  # other replicas tried before the first byte
    # A replica whose connects fail this many times in a row, or that times out
    # before its first byte, is set aside this long.
    gateway_cooldown_after: int = 2
    gateway_cooldown_s: float = 5.0
    gateway_max_outstanding_per_replica: int = 256  # in flight per replica before 429
    # Requests per model (in each gateway process) that wait for room when every
    # replica is at that bound, or their key at its max_concurrent, rather than a
    # 429 at once; taken in weighted fair order across keys (fleet/gateway/fair.py),
    # or arrival order with gateway_fair_share off. 0: no queue.
    gateway_fair_queue: int = 0
    gateway_fair_share: bool = True
    gateway_fair_wait_s: float = 30.0  # the longest a request waits there, then 429
    gateway_engine_scrape_s: float = 5.0  # how often engines' queue lengths are read
    # What the gateway accepts from an engine; past any of these the answer is
    # a 502 (an error event once a stream has started) and the connection closes.
    gateway_upstream_max_header_bytes: int = 64 << 10  # status line, headers, trailers
    gateway_upstream_max_headers: int = 100  # header lines in one answer
    gateway_upstream_max_body_bytes: int = 64 << 20  # a non-streamed answer, read whole
    gateway_engine_scrape_max_bytes: int = 4 << 20  # an engine's /metrics
    # Silence allowed while an answer's body is awaited (streams included); the
    # wait for the first byte is gateway_first_byte_timeout_s.
    gateway_upstream_idle_timeout_s: float = 60.0
    # Limits for keys that set none of their own (ApiKey fields; docs/gateway.md).
    # 0: no limit. Requests are counted before they reach an engine; tokens
    # (prompt + completion, from the engine's usage) as they are reported.
    gateway_default_requests_per_minute: int = 0
    gateway_default_tokens_per_minute: int = 0
    gateway_default_tokens_per_day: int = 0  # a budget per UTC day
    gateway_default_tokens_per_month: int = 0  # a budget per UTC calendar month
    # A request of a key with limits whose check Redis does not answer (250 ms)
    # is refused with 503 and told to retry after this; only that request, the
    # next one asks Redis again. Fail open: such requests pass unchecked instead.
    gateway_limits_retry_s: float = 2.0
    gateway_limits_fail_open: bool = False
    # How often each gateway process writes the usage it counted (per key,
    # model and hour) to the database; a killed process loses at most this.
    gateway_usage_flush_s: float = 10.0
    # Prefix-aware routing, for models that turn it on (Model.prefix_routing;
    # docs/gateway.md). Requests whose prompts begin with the same this many
    # characters (chat: the messages in order, system prompt first) go to one
    # replica, while its requests in flight stay within LOAD_FACTOR times the
    # average of the model's replicas and within MARGIN of the least busy one;
    # past either, to another.
    gateway_prefix_chars: int = 1024
    gateway_prefix_load_factor: float = 1.25
    gateway_prefix_margin: int = 8
    # Waiting for a replica (docs/gateway.md, "Waiting for a replica"): a request
    # for an autoscaled model with no ready replica asks for one and waits, at
    # most this many per model in each gateway process (more: 503 at once) and
    # at most this long (then 503 with Retry-After). A model may set its own.
    gateway_wait_queue: int = 64
    gateway_wait_timeout_s: float = 120.0
    # A streamed request that waits gets an SSE comment this often, so proxies
    # in between see bytes and keep the connection.
    gateway_wait_comment_s: float = 5.0
    # How often each gateway process reports its load to Redis: in flight and
    # waiting per model, and the last request's time (fleet.services.autoscaler.load).
    # A report older than the TTL is not counted: its process is gone.
    gateway_load_report_s: float = 1.0
    gateway_load_ttl_s: float = 10.0

    # The autoscaler (fleet/services/autoscaler; docs/operations.md), for models
    # with min_replicas and max_replicas. Outstanding requests per ready replica
    # it aims at, where the model sets no target_outstanding.
    autoscale_target_outstanding: float = 4.0
    # Up above target × (1 + this); down only when one replica fewer would be
    # below target × (1 - this).
    autoscale_hysteresis: float = 0.2
    # No step up within this long of the model's last step, and no step down
    # within this long; waking a model from zero is never held back.
    autoscale_up_cooldown_s: float = 15.0
    autoscale_down_cooldown_s: float = 120.0

    # The Batch API (/v1/files, /v1/batches; docs/gateway.md, "Batch API").
    # An uploaded file: at most this many bytes (413 past it, from Content-Length,
    # before it is read) and this many lines.
    batch_file_max_bytes: int = 200 << 20
    batch_max_lines: int = 100_000
    # Where batch files are kept: a Django storage backend and its options (JSON).
    # The default keeps them under the state dir (batch-files/); S3-compatible
    # storage is "storages.backends.s3.S3Storage" (django-storages, with boto3).
    batch_storage_backend: str = "django.core.files.storage.FileSystemStorage"
    batch_storage_options: str = "{}"
    # The gateway the workers send batch lines to, as the batch's key: this
    # installation's own /v1 (a web process, or the balancer in front of them).
    batch_gateway_url: str = "http://127.0.0.1:8000"
    # Lines in flight at once: per batch, and per team (or key of no team) over
    # all of its batches. Batches take what interactive traffic leaves.
    batch_concurrency: int = 4
    batch_team_concurrency: int = 8
    # Beat's interval for checking new batches, expiring old ones and handing
    # each team's batches to a worker.
    batch_tick_s: float = 2.0
    # How long one worker task sends lines before it gives its worker back to
    # other tasks (the next task picks up where it stopped).
    batch_slice_s: float = 10.0
    # A team's batches are run by one worker at a time, under a lease in Redis
    # renewed every third of this: a worker killed -9 is replaced within it.
    batch_lease_s: float = 15.0
    # A line refused for a passing reason (a rate limit, no replica ready, the
    # gateway away) is sent again after the answer's Retry-After, else this.
    batch_retry_s: float = 5.0

    # Costs (fleet.services.costs; docs/operations.md, "What the fleet costs"). The currency of new
    # prices and budgets; beat's interval for counting what each replica holds (and
    # the expiry of each entry); and the most one count adds, so that a control
    # plane stopped for a while does not invent what ran while nobody looked.
    cost_currency: str = "USD"
    cost_interval_s: float = 60.0
    cost_gap_max_s: float = 300.0

    @classmethod
    def from_mapping(cls, raw: Mapping) -> "FleetSettings":
        """From ``settings.LLMGW`` (keys in upper case); missing keys take the default."""
        known = {f.name.upper(): f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(f"unknown fleet setting(s) {', '.join(unknown)}")
        return cls(**{known[k]: v for k, v in raw.items()})


def networks(text: str) -> list:
    """``"10.0.0.0/8, fd00::/8"`` as ip_network objects; a ValueError names a bad one.

    A bare address is a network of one (``10.0.0.5`` is ``10.0.0.5/32``).
    """
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            out.append(ipaddress.ip_network(part))
        except ValueError:
            raise ValueError(f"'{part}' is not a network, e.g. 10.0.0.0/8") from None
    return out


def _parse(f: dataclasses.Field, text: str):
    if f.name == "engines":
        return _engines(text)
    if f.name in ("agent_addr_networks", "client_cert_proxies", "estimate_allow_networks"):
        networks(text)  # refused at start, not at the first register
        return text
    if f.name == "cost_currency":
        if not re.fullmatch(r"[A-Z]{3}", text):
            raise ValueError("must be three capital letters, e.g. USD")
        return text
    if f.type is bool:
        word = text.strip().lower()
        if word not in _BOOLS:
            raise ValueError("must be true or false (also 1/0, yes/no, on/off)")
        return _BOOLS[word]
    value = f.type(text)  # float, int or str
    low = _AT_LEAST.get(f.name)
    if low is not None and value < low:
        raise ValueError(f"must be at least {low}")
    return value


_BOOLS = {"1": True, "true": True, "yes": True, "on": True}
_BOOLS |= {"0": False, "false": False, "no": False, "off": False}

# Settings whose smaller values make no sense, refused at start.
_AT_LEAST = {
    "agent_handshakes_max": 0,
    "gateway_prefix_chars": 1,
    "gateway_prefix_load_factor": 1.0,
    "gateway_prefix_margin": 0,
    "batch_file_max_bytes": 1,
    "batch_max_lines": 1,
    "batch_concurrency": 1,
    "batch_team_concurrency": 1,
    "batch_slice_s": 0.1,
    "batch_lease_s": 1.0,
    "cost_interval_s": 1.0,
    "cost_gap_max_s": 1.0,
}


def from_environ(environ: Mapping[str, str] = os.environ) -> dict:
    """Every fleet setting from ``LLMGW_<NAME>`` or its default, as ``settings.LLMGW`` keeps them.

    A value that does not parse is a ValueError naming the variable and the value.
    """
    values = {}
    for f in dataclasses.fields(FleetSettings):
        name = f"LLMGW_{f.name.upper()}"
        text = environ.get(name)
        if text is None:
            value = f.default_factory() if f.default is dataclasses.MISSING else f.default
        else:
            try:
                value = _parse(f, text)
            except ValueError as exc:
                raise ValueError(f"{name}={text!r}: {exc}") from None
        values[f.name.upper()] = value
    return values


# The dict it was made from (held, so it is compared by identity) and the result.
_cached: tuple[Mapping, FleetSettings] | None = None


def fleet_settings() -> FleetSettings:
    """The fleet's settings as they are now (``settings.LLMGW``), typed."""
    global _cached
    from django.conf import settings

    raw = settings.LLMGW
    if _cached is None or _cached[0] is not raw:
        _cached = (raw, FleetSettings.from_mapping(raw))
    return _cached[1]
