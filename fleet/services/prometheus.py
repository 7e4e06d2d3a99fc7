"""Reading Prometheus's HTTP API: ``query_range``, bounded in time and size.

Used by the node charts when ``LLMGW_PROMETHEUS_URL`` is set. A person is
waiting for the page, so every query is bounded by ``LLMGW_PROMETHEUS_TIMEOUT_S``
and an answer larger than ``MAX_BYTES`` is refused rather than read.
"""

import json
import urllib.error
import urllib.parse
import urllib.request

from fleet.conf import fleet_settings

MAX_BYTES = 8 << 20


class PrometheusError(Exception):
    """Prometheus did not answer, or not with a result. The message says which."""


def quote(value: str) -> str:
    """A PromQL string literal: label values come from agents and operators."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def query_range(
    query: str, start: float, end: float, step: float, *, base_url: str | None = None
) -> list[tuple[dict, list[tuple[float, float]]]]:
    """Each series of a range query as (labels, [(time, value)]), oldest point first."""
    base = (base_url if base_url is not None else fleet_settings().prometheus_url).rstrip("/")
    params = urllib.parse.urlencode(
        {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    url = f"{base}/api/v1/query_range?{params}"
    timeout = fleet_settings().prometheus_timeout_s
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - an operator's URL
            body = resp.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(4096).decode("utf-8", "replace")
        raise PrometheusError(f"Prometheus at {base} answered {exc.code}: {detail[:300]}") from None
    except (OSError, ValueError) as exc:
        raise PrometheusError(f"Prometheus at {base} did not answer: {exc}") from None
    if len(body) > MAX_BYTES:
        raise PrometheusError(f"Prometheus at {base} answered more than {MAX_BYTES} bytes")
    try:
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise PrometheusError(f"Prometheus at {base}: {doc.get('error', 'no result')}")
        out = []
        for series in doc["data"]["result"]:
            points = []
            for t, v in series.get("values", []):
                value = float(v)
                if value == value:  # NaN: no sample at that step
                    points.append((float(t), value))
            out.append((dict(series.get("metric", {})), points))
        return out
    except (KeyError, TypeError, ValueError) as exc:
        raise PrometheusError(f"Prometheus at {base} answered something else: {exc}") from None
