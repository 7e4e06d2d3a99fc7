"""What one gateway process keeps in memory, and the tasks that keep it fresh.

One ``Gateway`` per event loop (a web process has one), made with its bounds
(``fleet.gateway.limits``). It loads
the routing table and the API keys on the first request, then refreshes them
when the channel layer rings (``fleet.services.doorbells``) and periodically in
case a ring was lost. Requests only read what is in memory; the one write they
cause, ``last_used_at``, is collected and written in a batch.
"""

import asyncio
import logging
import os
import socket
import time
import weakref

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from fleet.conf import fleet_settings
from fleet.services import doorbells, history
from fleet.services.doorbells import GATEWAYS_GROUP

from . import engines, fair, keys, metrics, ratelimit, table, usage, waiting
from .errors import GatewayError
from .limits import Limits
from .upstream import Client

logger = logging.getLogger(__name__)


def _write_last_used(ids: list[int]) -> None:
    from fleet.models import ApiKey

    ApiKey.objects.filter(pk__in=ids).update(last_used_at=timezone.now())


# Authorization headers whose secret and digest are remembered (Gateway._secret_and_digest).
_AUTH_CACHE = 4096


class Gateway:
    def __init__(self):
        self.limits = Limits.from_settings()
        c = fleet_settings()
        # Requests waiting for room on a busy model, taken in fair order across keys.
        self.fair = fair.FairShare(
            c.gateway_fair_queue, c.gateway_fair_share, c.gateway_fair_wait_s
        )
        self.routes: dict[str, table.Route] = {}
        # Answers per profile of each model running a canary, since this process saw
        # it: {(model, canary profile id): {profile: Tally}} (fleet.services.canary_figures).
        self.canary_counts: dict[tuple[str, int], dict] = {}
        self.keys: dict[str, keys.KeyEntry] = {}
        self.used_keys: set[int] = set()
        self.limiter = ratelimit.Limiter(
            retry_s=self.limits.limits_retry_s, fail_open=self.limits.limits_fail_open
        )
        self.usage = usage.Usage()
        self.scraper: Client | None = None  # engines' /metrics, with its own bounds
        self.client: Client | None = None  # the request path
        self.started = False
        self.keys_loaded_at = 0.0
        self.routes_loaded_at = 0.0
        self._start_lock = asyncio.Lock()
        self._keys_lock = asyncio.Lock()
        self._routes_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._wake_what: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self._miss_reload: asyncio.Future | None = None
        self.retired: list[tuple[str, table.Upstream]] = []
        self._channel: str | None = None
        # Scale to zero and autoscaling (fleet.gateway.waiting): requests waiting
        # for a replica per model, each model's last request (time.perf_counter()),
        # and what wakes the waiting and the load report.
        self.waiting: dict[str, int] = {}
        self.last_request: dict[str, float] = {}
        self.replica_ready: dict[str, asyncio.Event] = {}
        self.demand_event = asyncio.Event()
        # Requests in flight not yet listening for their client's going away,
        # oldest first, and the task that starts them listening (fleet.gateway.app).
        self.watched: dict = {}
        self._auth_cache: dict[bytes, tuple[str, str]] = {}
        self.sweeper: asyncio.Task | None = None

    # ---- start and stop --------------------------------------------------------

    async def ensure_started(self) -> None:
        if self.started:
            return
        async with self._start_lock:
            if self.started:
                return
            try:
                await asyncio.gather(self.reload_routes(), self.reload_keys())
            except Exception as exc:
                logger.exception("gateway could not load its routing table")
                raise GatewayError(
                    503,
                    f"the gateway could not load its routing table: {exc}",
                    code="gateway_starting",
                    retry_after=1,
                ) from exc
            self.client = Client(self.limits.connect_timeout_s, self.limits.upstream)
            self.scraper = Client(self.limits.connect_timeout_s, self.limits.scrape)
            self._tasks = [
                asyncio.ensure_future(self._listen()),
                asyncio.ensure_future(self._refresher()),
                asyncio.ensure_future(self._flush_last_used()),
                asyncio.ensure_future(self._flush_usage()),
                asyncio.ensure_future(self._scrape_engines()),
                asyncio.ensure_future(self._record_history()),
                asyncio.ensure_future(waiting.report_load(self)),
            ]
            self.started = True
            logger.info(
                "gateway started models=%d ready_replicas=%d keys=%d",
                len(self.routes),
                sum(len(r.upstreams) for r in self.routes.values()),
                len(self.keys),
            )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._write_used()
        await self.write_usage()
        await self.limiter.close()
        if self.client is not None:
            self.client.close()
        if self.scraper is not None:
            self.scraper.close()
        self.started = False

    # ---- loading ---------------------------------------------------------------

    async def reload_routes(self) -> None:
        async with self._routes_lock:
            models, replicas, adapters = await database_sync_to_async(table.load_snapshot)()
            new = table.build_routes(models, replicas, self.routes, adapters)
            self._log_changes(self.routes, new)
            for route in new.values():
                old = self.routes.get(route.name)
                if old is not None and old.base == route.base:
                    route.metrics = old.metrics
                else:
                    route.metrics = metrics.RouteMetrics(route.name, route.base)
            # Replicas that left the table (draining, say) with requests still in
            # flight stay visible in the in-flight gauge until those finish.
            live = {id(u) for r in new.values() for u in r.upstreams}
            self.retired = list(
                {
                    id(u): (model, u)
                    for model, u in self.upstreams_in_service()
                    if id(u) not in live
                }.values()
            )
            self.routes = new
            self.routes_loaded_at = time.monotonic()
            waiting.routes_changed(self)

    def upstreams_in_service(self):
        """(model, upstream) for every replica in the table or still finishing requests."""
        for route in list(self.routes.values()):
            if route.base:
                continue  # an adapter's replicas are its base model's, counted there
            for up in route.upstreams:
                yield route.name, up
        for model, up in self.retired:
            if up.outstanding > 0:
                yield model, up

    @staticmethod
    def _log_changes(old: dict, new: dict) -> None:
        # A change is worth a line; a refresh that changed nothing is not.
        for name, route in new.items():
            before = old.get(name)
            ids = sorted(u.replica_id for u in route.upstreams)
            if before is None or sorted(u.replica_id for u in before.upstreams) != ids:
                logger.info(
                    "gateway route model=%s ready=%s%s",
                    name,
                    ids,
                    f" unavailable={route.unavailable!r}" if route.unavailable else "",
                )

    async def reload_keys(self) -> None:
        async with self._keys_lock:
            self.keys = await database_sync_to_async(keys.load_keys)()
            self.keys_loaded_at = time.monotonic()

    def _secret_and_digest(self, headers) -> tuple[str, str | None]:
        """The bearer secret and its digest, from a cache keyed by the header's bytes.

        A client sends the same Authorization header with every request; parsing
        it and hashing the secret cost more than the rest of the key check. Only
        well-formed secrets are kept, at most ``_AUTH_CACHE`` of them (emptied
        when full), so invented ones cannot grow it; the secrets are those this
        process reads from every request anyway.
        """
        value = None
        for name, v in headers:
            if name == b"authorization":
                value = v
                break
            if name == b"x-api-key":
                # Anthropic's clients send the key so; Authorization wins (keys.bearer).
                value = v
        if value is not None:
            hit = self._auth_cache.get(value)
            if hit is not None:
                return hit
        secret = keys.bearer(headers)
        digest = keys.digest_of(secret)
        if digest is not None and value is not None:
            if len(self._auth_cache) >= _AUTH_CACHE:
                self._auth_cache.clear()
            self._auth_cache[value] = (secret, digest)
        return secret, digest

    def known_key(self, headers) -> keys.KeyEntry | None:
        """``key_for`` without waiting: None when the key is not in memory (a reload may
        find it); the 401/403 when it is known and may not be used."""
        secret, digest = self._secret_and_digest(headers)
        entry = self.keys.get(digest) if digest else None
        if entry is None and digest is not None:
            return None
        entry = keys.check(entry, secret, time.time())
        self.used_keys.add(entry.id)
        return keys.as_batch(entry, secret)

    async def key_for(self, headers) -> keys.KeyEntry:
        entry = self.known_key(headers)
        if entry is not None:
            return entry
        # Perhaps a key created a moment ago in another process. Misses share
        # one reload at most once a second, which bounds what a client with
        # a wrong key can cost.
        secret, digest = self._secret_and_digest(headers)
        if self._miss_reload is None or self._miss_reload.done():
            delay = max(0.0, self.keys_loaded_at + 1 - time.monotonic())
            self._miss_reload = asyncio.ensure_future(self._reload_keys_after(delay))
        await asyncio.shield(self._miss_reload)
        entry = keys.check(self.keys.get(digest), secret, time.time())
        self.used_keys.add(entry.id)
        return keys.as_batch(entry, secret)

    async def _reload_keys_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.reload_keys()

    def demand(self) -> None:
        """A request started waiting for a replica: report it and ask for a pass now."""
        self.demand_event.set()

    # ---- background ------------------------------------------------------------

    def wake(self, what: str = "all") -> None:
        self._wake_what.add(what)
        self._wake.set()

    async def _listen(self) -> None:
        """Join the gateways' group and turn each ring into a refresh."""
        layer = get_channel_layer()
        if layer is None:
            return
        down = False
        while True:
            try:
                channel = await doorbells.process_channel(layer)
                await layer.group_add(GATEWAYS_GROUP, channel)
                self._channel = channel
                if down:
                    logger.info("gateway hears the channel layer again")
                    down = False
                # Whatever changed while we were not listening.
                self.wake()
                while True:
                    msg = await layer.receive(channel)
                    self.wake(msg.get("what") or "all")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: periodic refresh covers it
                # Once per outage, not every retry.
                if not down:
                    logger.warning(
                        "gateway cannot hear the channel layer (%s); refreshing every %g s "
                        "until it is back",
                        exc,
                        self.limits.keys_refresh_s,
                    )
                    down = True
                await asyncio.sleep(2)

    async def _refresher(self) -> None:
        last_group_add = time.monotonic()
        failing = False
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.limits.keys_refresh_s)
            except TimeoutError:
                pass
            what, self._wake_what = self._wake_what, set()
            self._wake.clear()
            now = time.monotonic()
            try:
                await self.reload_keys()
                if what or now - self.routes_loaded_at >= self.limits.refresh_s:
                    await self.reload_routes()
                channel = self._channel
                if channel and now - last_group_add > 3600:
                    # Group membership expires in Redis after a day: renew it.
                    await get_channel_layer().group_add(GATEWAYS_GROUP, channel)
                    last_group_add = now
                if failing:
                    logger.info("gateway refresh works again")
                    failing = False
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep serving from what we have
                if not failing:
                    logger.warning(
                        "gateway refresh failed; serving the last table until it works",
                        exc_info=True,
                    )
                    failing = True
                await asyncio.sleep(1)

    async def _write_used(self) -> None:
        if not self.used_keys:
            return
        ids, self.used_keys = sorted(self.used_keys), set()
        try:
            await database_sync_to_async(_write_last_used)(ids)
        except Exception:  # noqa: BLE001 - a lost last_used is not worth a failed request
            logger.warning("could not record API key use for %d keys", len(ids), exc_info=True)

    def tally(self, key: keys.KeyEntry, model: str, prompt: int, completion: int) -> float:
        """An answer's tokens into this hour's usage (no I/O); when, for ``charge``."""
        now = time.time()
        self.usage.add(key.id, model, prompt, completion, now)
        return now

    async def charge(self, key: keys.KeyEntry, tokens: int, now: float) -> None:
        """An answer's tokens against the key's token limits (Redis)."""
        if key.limits.tokens_on:
            await self.limiter.charge(key, tokens, now)

    async def write_usage(self) -> None:
        counts = self.usage.take()
        if not counts:
            return
        try:
            left = await database_sync_to_async(usage.write)(counts)
        except Exception:  # noqa: BLE001 - nothing was written: all kept for the next flush
            logger.warning("could not write key usage (%d rows kept)", len(counts), exc_info=True)
            left = counts
        if left:
            self.usage.put_back(left)

    async def _flush_usage(self) -> None:
        while True:
            await asyncio.sleep(self.limits.usage_flush_s)
            await self.write_usage()

    async def _scrape_engines(self) -> None:
        while True:
            await asyncio.sleep(self.limits.engine_scrape_s)
            upstreams = [u for r in list(self.routes.values()) for u in r.upstreams]
            try:
                await engines.scrape(self.scraper, upstreams, min(2.0, self.limits.engine_scrape_s))
            except Exception:  # noqa: BLE001 - a missing gauge is not worth a dead task
                logger.warning("scraping the engines' queues failed", exc_info=True)

    async def _record_history(self) -> None:
        # The console's charts and model pages read these when no Prometheus is
        # configured (fleet.services.history). In a thread: Redis is a round trip.
        source = f"{socket.gethostname()}:{os.getpid()}"
        while True:
            await asyncio.sleep(fleet_settings().history_step_s)
            try:
                figures = metrics.model_figures(lambda: [self])
                await asyncio.to_thread(history.record_gateway, figures, source)
            except Exception:  # noqa: BLE001 - a missing point is not worth a dead task
                logger.warning("recording the gateway's figures failed", exc_info=True)

    async def _flush_last_used(self) -> None:
        while True:
            await asyncio.sleep(self.limits.last_used_flush_s)
            await self._write_used()


_gateways: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Gateway]" = (
    weakref.WeakKeyDictionary()
)


def live_gateways() -> list[Gateway]:
    return [gw for gw in list(_gateways.values()) if gw.started]


metrics.register_in_flight(live_gateways)


_last: tuple = (None, None)  # (a weak reference to a loop, its gateway): the usual answer


def gateway() -> Gateway:
    global _last
    loop = asyncio.get_running_loop()
    ref, gw = _last
    if ref is not None and ref() is loop:
        return gw
    gw = _gateways.get(loop)
    if gw is None:
        gw = _gateways[loop] = Gateway()
    _last = (weakref.ref(loop), gw)
    return gw


def canary_tally(gw, route: table.Route, profile: str):
    """The tally of ``profile`` for ``route``'s canary, made on first use."""
    from fleet.services.canary_figures import Tally

    by_profile = gw.canary_counts.setdefault((route.name, route.canary_profile_id), {})
    tally = by_profile.get(profile)
    if tally is None:
        tally = by_profile[profile] = Tally()
    return tally
