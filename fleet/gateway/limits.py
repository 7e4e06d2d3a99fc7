"""The gateway's own bounds, timeouts and periods (``Limits``), read once from the
fleet's settings (``fleet.conf``) when a ``Gateway`` is made.

How large a body each endpoint takes, how long an engine has to connect, to
answer and to finish, how often the table and the keys are refreshed, how many
retries, how long a failing replica is set aside, how much prefix routing reads,
and what the gateway accepts from engines (``ReadLimits``, for the request path
and for scraping their /metrics). A key's own limits are ``ratelimit``'s.
"""

import dataclasses
from dataclasses import dataclass

from fleet.conf import fleet_settings

from . import prefix
from .http1 import ReadLimits


@dataclass(frozen=True)
class Limits:
    """What one gateway process holds to; ``from_settings`` reads it."""

    max_body_bytes: dict[str, int]  # by endpoint ("chat/completions", ...)
    connect_timeout_s: float
    first_byte_timeout_s: float
    total_timeout_s: float
    refresh_s: float
    keys_refresh_s: float
    last_used_flush_s: float
    max_retries: int
    cooldown_s: float
    cooldown_after: int
    max_outstanding: int
    engine_scrape_s: float
    limits_retry_s: float
    limits_fail_open: bool
    usage_flush_s: float
    prefix_chars: int  # how much of a prompt decides its replica, for prefix routing
    prefix_policy: prefix.Policy  # when a prefix's replica yields to another
    upstream: ReadLimits  # what the request path accepts from engines
    scrape: ReadLimits  # what a scrape of an engine's /metrics accepts

    @classmethod
    def from_settings(cls) -> "Limits":
        c = fleet_settings()
        upstream = ReadLimits(
            max_header_bytes=c.gateway_upstream_max_header_bytes,
            max_headers=c.gateway_upstream_max_headers,
            max_body_bytes=c.gateway_upstream_max_body_bytes,
            idle_s=c.gateway_upstream_idle_timeout_s,
        )
        ceiling = c.gateway_max_body_bytes
        return cls(
            max_body_bytes={
                "chat/completions": ceiling,
                "completions": min(ceiling, c.gateway_completions_max_body_bytes),
                "embeddings": min(ceiling, c.gateway_embeddings_max_body_bytes),
                # A conversation, as chat's: images travel inline there too.
                "messages": ceiling,
                "responses": ceiling,
                # A query and its documents: a batch of texts, as embeddings'.
                "rerank": min(ceiling, c.gateway_embeddings_max_body_bytes),
                "score": min(ceiling, c.gateway_embeddings_max_body_bytes),
            },
            connect_timeout_s=c.gateway_connect_timeout_s,
            first_byte_timeout_s=c.gateway_first_byte_timeout_s,
            total_timeout_s=c.gateway_total_timeout_s,
            refresh_s=c.gateway_refresh_s,
            keys_refresh_s=c.gateway_keys_refresh_s,
            last_used_flush_s=c.gateway_last_used_flush_s,
            max_retries=c.gateway_max_retries,
            cooldown_s=c.gateway_cooldown_s,
            cooldown_after=c.gateway_cooldown_after,
            max_outstanding=c.gateway_max_outstanding_per_replica,
            engine_scrape_s=c.gateway_engine_scrape_s,
            limits_retry_s=c.gateway_limits_retry_s,
            limits_fail_open=c.gateway_limits_fail_open,
            usage_flush_s=c.gateway_usage_flush_s,
            prefix_chars=c.gateway_prefix_chars,
            prefix_policy=prefix.Policy(
                load_factor=c.gateway_prefix_load_factor,
                margin=c.gateway_prefix_margin,
                max_outstanding=c.gateway_max_outstanding_per_replica,
            ),
            upstream=upstream,
            scrape=dataclasses.replace(upstream, max_body_bytes=c.gateway_engine_scrape_max_bytes),
        )
