"""How llmgw reaches the control plane: which address and key (flags, environment, its
config file), the request itself, and a refusal or failure worded with its exit status.
Changes when the way to connect does; no verb's output is here.

The key goes to the configured address only: a redirect to another host, port or
scheme ends the command (status 4), naming where it pointed, instead of carrying the
key there.
"""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from agentd import __version__
from agentd.ctl.exits import EXIT_AUTH, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, Failure

CONFIG_PATH = Path("~/.config/llmgw/cli.yaml")
TIMEOUT_S = 30.0


# ---- where, and with which key ---------------------------------------------------------


def _config_file(path: Path) -> dict:
    path = path.expanduser()
    if not path.exists():
        return {}
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise Failure(
            f"{path} holds an API key and is readable by others (mode {mode & 0o777:o}); "
            f"run: chmod 600 {path}",
            EXIT_USAGE,
        )
    import yaml

    from agentd import safeyaml

    try:
        data = safeyaml.load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise Failure(f"{path}: cannot read it: {exc}", EXIT_USAGE) from None
    if not isinstance(data, dict) or set(data) - {"url", "api_key"}:
        raise Failure(f"{path}: expected only the keys url and api_key", EXIT_USAGE)
    return data


def settings(args) -> tuple[str, str]:
    """The control plane's address and the key, from --url / --config, the environment
    or ``CONFIG_PATH``."""
    conf = _config_file(Path(args.config)) if args.config else _config_file(CONFIG_PATH)
    url = args.url or os.environ.get("LLMGW_URL") or conf.get("url") or ""
    key = os.environ.get("LLMGW_API_KEY") or conf.get("api_key") or ""
    if not url:
        raise Failure(
            f"no control plane named: pass --url, set LLMGW_URL, or put url: in {CONFIG_PATH}",
            EXIT_USAGE,
        )
    if not key:
        raise Failure(
            "no API key: set LLMGW_API_KEY, or put api_key: in "
            f"{CONFIG_PATH} (mode 600); create one with manage.py create_api_key --scope manage",
            EXIT_USAGE,
        )
    return url.rstrip("/"), str(key)


# ---- the API -----------------------------------------------------------------------------


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


class _KeyStaysHome(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the configured control plane (the same host and
    port, or its https on 443), since the request carries the manage key and urllib
    would hand it to whatever host a redirect names. Anything else ends the command,
    naming the host, with the key sent nowhere new."""

    def __init__(self, home: str):
        self.home = home

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        newurl = urllib.parse.urljoin(req.full_url, newurl)
        scheme, host, port = _origin(newurl)
        _, home_host, home_port = _origin(self.home)
        same = scheme in ("http", "https") and host == home_host
        if not (same and (port == home_port or (scheme, port) == ("https", 443))):
            shown = urllib.parse.urlsplit(newurl).netloc or newurl
            raise Failure(
                f"the control plane at {self.home} redirected ({code}) to {scheme}://{shown}; "
                f"llmgw sends its key only to {home_host}, so it stopped there. If the "
                "control plane is now at that address, pass it with --url",
                EXIT_UNREACHABLE,
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class Api:
    def __init__(self, url: str, key: str, timeout: float = TIMEOUT_S):
        self.url, self.key, self.timeout = url, key, timeout
        self._opener = urllib.request.build_opener(_KeyStaysHome(url))

    def call(self, method: str, path: str, body: dict | None = None, *, accept: str = "", **query):
        """The API's answer to ``method path``: its JSON, or with ``accept`` (a type such as
        text/csv) its text as it came."""
        query = {k: v for k, v in query.items() if v is not None}
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.key}")
        req.add_header("Accept", accept or "application/json")
        # The audit trail says a change came through llmgw (fleet/audit.py).
        req.add_header("User-Agent", f"llmgw/{__version__}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise _refusal(exc, method, path) from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise Failure(
                f"cannot reach the control plane at {self.url}: {why}", EXIT_UNREACHABLE
            ) from None
        if accept:
            return raw.decode("utf-8")
        return json.loads(raw) if raw else None

    def all_pages(self, path: str) -> list:
        """Every item of a collection, following its pages (or the list, unpaginated)."""
        page = self.call("GET", path)
        if isinstance(page, list):
            return page
        items = list(page.get("results", []))
        while page.get("next"):
            nxt = urllib.parse.urlsplit(page["next"])
            page = self.call(
                "GET", nxt.path.split("/api/v1/", 1)[1] + (f"?{nxt.query}" if nxt.query else "")
            )
            items += page.get("results", [])
        return items


def quote(part: str) -> str:
    """One segment of an API path (a node's name, a key's prefix), escaped."""
    return urllib.parse.quote(part, safe="")


def _refusal(exc: urllib.error.HTTPError, method: str, path: str) -> Failure:
    raw = exc.read()
    try:
        detail = json.loads(raw)
    except ValueError:
        detail = raw.decode("utf-8", "replace").strip()[:300]
    text = _detail_text(detail)
    if exc.code in (401, 403):
        hint = "the key was refused" if exc.code == 401 else "the key's user may not do this"
        return Failure(f"{hint}: {text}", EXIT_AUTH)
    if exc.code >= 500:
        return Failure(f"the control plane failed ({exc.code}): {text}", EXIT_UNREACHABLE)
    if exc.code == 404:
        return Failure(f"not found: {method} {path}: {text}", EXIT_REFUSED)
    return Failure(text, EXIT_REFUSED)


def _detail_text(detail) -> str:
    """DRF's error bodies, flattened: 'detail' alone, or 'field: problem' per line."""
    if isinstance(detail, dict):
        if set(detail) == {"detail"} or ("detail" in detail and len(detail) <= 2):
            return str(detail["detail"])
        parts = []
        for field, problems in detail.items():
            items = problems if isinstance(problems, list) else [problems]
            parts += [f"{field}: {p}" for p in items]
        return "\n".join(parts)
    if isinstance(detail, list):
        return "\n".join(str(d) for d in detail)
    return str(detail)
