"""A line sent to the gateway, and what its answer means for the line.

Each line goes to the gateway (``LLMGW_BATCH_GATEWAY_URL``) as an ordinary
HTTP request (``Sender``, a keep-alive connection per pool thread). Its answer
is the line's, or says to send it again later (``verdict``): no answer, a
rate limit, no replica ready, or a 5xx within its attempts. This changes with
the gateway's answers; when and how many lines are sent is ``runner``'s.
"""

import http.client
import json
import logging
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

# A line whose gateway failed it (a 5xx other than "not now") is tried this often,
# within a slice, before that answer is its own.
ATTEMPTS = 3
# Answers the gateway gives when the line should wait and go again, by error code.
_NOT_NOW = {
    "rate_limit_exceeded",
    "model_at_capacity",
    "too_many_in_flight",
    "no_ready_replica",
    "too_many_waiting",
    "limits_unavailable",
    "gateway_starting",
}


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no answer (the connection failed)
    body: bytes = b""
    retry_after: float | None = None


def verdict(answer: Answer, attempts: int, default_wait_s: float) -> float | None:
    """Seconds to wait before sending the line again, or None when this answer is the line's.

    Not now: no answer at all, a 429 other than a spent budget, or a 503 (no replica
    ready, too many waiting, limits unavailable). A 5xx the engine or the gateway
    failed with is tried ``ATTEMPTS`` times. Anything else (2xx, 4xx, a spent budget)
    is the line's answer.
    """
    wait_s = answer.retry_after if answer.retry_after is not None else default_wait_s
    if answer.status is None:
        return wait_s
    if answer.status == 429 or answer.status == 503:
        code = _error_code(answer.body)
        if code == "insufficient_quota":
            return None
        if answer.status == 503 or code in _NOT_NOW or code is None:
            return wait_s
        return None
    if answer.status >= 500 and attempts < ATTEMPTS:
        return wait_s
    return None


def _error_code(body: bytes) -> str | None:
    try:
        error = json.loads(body).get("error")
        return error.get("code") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        return None


class Sender:
    """HTTP/1.1 to the gateway, one keep-alive connection per pool thread."""

    def __init__(self, base_url: str, timeout_s: float):
        parts = urlsplit(base_url.rstrip("/"))
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port
        self.path = parts.path.removesuffix("/v1")
        self.timeout_s = timeout_s
        self.local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = self.local.conn = kind(self.host, self.port, timeout=self.timeout_s)
        return conn

    def send(self, url: str, token: str, body: bytes) -> Answer:
        conn = self._connection()
        try:
            conn.request(
                "POST",
                self.path + url,
                body=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            self.local.conn = None
            logger.info("batch line not sent: %s", exc)
            return Answer(None)
        if resp.getheader("connection", "").lower() == "close":
            conn.close()
            self.local.conn = None
        retry = resp.getheader("retry-after")
        try:
            retry_after = float(retry) if retry else None
        except ValueError:
            retry_after = None
        return Answer(resp.status, data, retry_after)
