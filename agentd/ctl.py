"""llmgw: the fleet from an operator's laptop, through the management API only.

``llmgw nodes``, ``llmgw drain gpu-07 --wait``, ``llmgw apply -f catalog.yaml`` … do
what the ``manage.py`` commands of the same names do, over HTTP with a ``manage`` API
key, so they need neither the control plane's database nor its settings. Installed
with the agent (``pip install .``), standard library and PyYAML only.

Where it connects: ``--url`` / ``LLMGW_URL``; the key: ``LLMGW_API_KEY``; or both from
``~/.config/llmgw/cli.yaml`` (``url:`` and ``api_key:``), which must be readable by its
owner alone (mode 0600), as ssh insists for its keys. The key goes to that
address only: a redirect to another host, port or scheme ends the command
(status 4), naming where it pointed, instead of carrying the key there.

Exit status, for scripts: 0 done; 1 the API refused the request (it says why);
2 bad usage or a bad file, nothing sent; 3 the key was refused (unknown, revoked, not
a manage key); 4 the control plane could not be reached or failed (5xx); 5 ``--wait``
ran out of time.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from agentd import __version__, tables

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_AUTH, EXIT_UNREACHABLE, EXIT_TIMEOUT = range(6)
CONFIG_PATH = Path("~/.config/llmgw/cli.yaml")
TIMEOUT_S = 30.0


class Failure(Exception):
    """Ends the command: ``message`` to stderr, ``code`` as the exit status."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


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


def _settings(args) -> tuple[str, str]:
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


# ---- output -------------------------------------------------------------------------------


def _table(rows: list[list[str]], out) -> None:
    out.writelines(line + "\n" for line in tables.lines(rows))


def _nodes(api: Api, args, out):
    rows = api.call("GET", "nodes/table/")
    if args.json:
        return rows
    if not rows:
        out.write("no nodes yet: enrol one with a join token (manage.py create_join_token)\n")
        return None
    out.writelines(line + "\n" for line in tables.node_lines(rows))
    return None


def _node(api: Api, args, out):
    node = api.call("GET", f"nodes/{_quote(args.node)}/")
    if args.json:
        return node
    load = node.get("load") or {}
    lines = [
        ("node", node["id"]),
        ("hostname", node.get("hostname") or "-"),
        (
            "state",
            node["state"]
            + (
                ",draining" if node.get("draining") else ",cordoned" if node.get("cordoned") else ""
            ),
        ),
        ("connected", "yes" if node.get("connected") else "no"),
        ("last seen", node.get("last_seen") or "-"),
        ("agent", node.get("agent_version") or "-"),
        ("address", node.get("mgmt_addr") or "-"),
        (
            "memory",
            f"{node['memory_total_mb'] / 1000:.1f} GB" if node.get("memory_total_mb") else "-",
        ),
        ("CPU", f"{load['cpu_percent']:.0f} %" if load.get("cpu_percent") is not None else "-"),
        (
            "engines",
            ", ".join(f"{k} {v}" for k, v in sorted((node.get("engine_versions") or {}).items()))
            or "-",
        ),
        ("vLLM build", node.get("vllm_build") or "-"),
        (
            "installs",
            "; ".join(_install_text(i) for i in node.get("engine_installs") or []) or "-",
        ),
        (
            "labels",
            ", ".join(f"{k}={v}" for k, v in sorted((node.get("labels") or {}).items())) or "-",
        ),
        (
            "desired set",
            f"v{node.get('desired_version')} (acked v{node.get('acked_version')})"
            + ("; not keeping up" if node.get("not_keeping_up") else ""),
        ),
    ]
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        out.write(f"{k.ljust(width)}  {v}\n")
    if node.get("notice_deadline"):
        said = node.get("notice_source") or "-"
        if node.get("notice_reason"):
            said += f": {node['notice_reason']}"
        out.write(f"{'notice'.ljust(width)}  goes away at {node['notice_deadline']} ({said})\n")
    for gpu in node.get("gpus") or []:
        health = gpu.get("health") or "healthy"
        if gpu.get("health_reason"):
            health += f" ({gpu['health_reason']})"
        xids = ", ".join(f"{k}×{v}" for k, v in sorted((gpu.get("xids") or {}).items()))
        out.write(
            f"gpu {gpu.get('index')}: {gpu.get('name')}, "
            f"{gpu.get('memory_used_mb', '-')}/{gpu.get('memory_total_mb', '-')} MB, {health}"
            + (f", XIDs {xids}" if xids else "")
            + "\n"
        )
    return None


def _node_or_notice(api: Api, args, out):
    """``llmgw node NODE``, or ``llmgw node notice NODE --in TIME``."""
    if args.node == "notice" and args.notice_node:
        if args.in_ is None:
            raise Failure("node notice: say when it goes away: --in 120s (or 2m, 120)", EXIT_USAGE)
        return _node_notice(api, args, out)
    if args.notice_node or args.in_ is not None or args.reason:
        raise Failure(
            "node: --in and --reason are for 'llmgw node notice NODE --in TIME'", EXIT_USAGE
        )
    return _node(api, args, out)


def _install_text(i: dict) -> str:
    """One engine's install, worded as in ``manage.py nodes`` (agentd.sources.describe)."""
    from agentd.sources import describe  # here, not above: most commands never need it

    fields = ("engine", "version", "variant", "state", "detail")
    return describe(*(str(i.get(k) or "") for k in fields), i.get("progress_percent"))


def _engine_build(api: Api, args, out):
    node = api.call("POST", f"nodes/{_quote(args.node)}/vllm-build/", {"vllm_build": args.build})
    if args.json:
        return node
    out.write(f"{node['id']}: vLLM build {node['vllm_build']} (the node is told at once)\n")
    return None


def _listing(api: Api, args, out, path: str, empty: str, header: list[str], row):
    """A collection of the API as a table (``row`` makes each line), or its JSON."""
    items = _all_pages(api, path)
    if args.json:
        return items
    if not items:
        out.write(empty + "\n")
        return None
    _table([header, *map(row, items)], out)
    return None


def _models(api: Api, args, out):
    def row(m) -> list[str]:
        return [
            m["name"],
            m.get("team") or "-",
            str(m.get("desired_replicas", "-")),
            str(m.get("priority", "-")),  # an older control plane has none
            m.get("scaling") or "-",  # an older control plane has no such field
            m.get("sleep") or "-",  # "1 asleep; after 300 s idle, level 1"
            str(m.get("active_profile_name") or m.get("active_profile") or "-"),
            (m.get("description") or "")[:60],
        ]

    header = [
        "MODEL",
        "TEAM",
        "REPLICAS",
        "PRIORITY",
        "SCALING",
        "SLEEP",
        "PROFILE",
        "DESCRIPTION",
    ]
    empty = "no models in the catalog: llmgw apply -f catalog.yaml"
    return _listing(api, args, out, "models/", empty, header, row)


def _teams(api: Api, args, out):
    def of(used, quota) -> str:
        return f"{used} of {quota}" if quota is not None else f"{used}"

    def row(t) -> list[str]:
        use = t.get("in_use") or {}
        return [
            t["name"],
            ",".join(t.get("members") or []) or "-",
            of(use.get("gpus", 0), t.get("max_gpus")),
            of(use.get("gpu_memory_gb", 0), t.get("max_gpu_memory_gb")),
            of(use.get("replicas", 0), t.get("max_replicas")),
            of(use.get("tokens_this_month", 0), t.get("tokens_per_month")),
            str(t.get("max_priority", 0)),
            "-"
            if t.get("guaranteed_gpu_memory_gb") is None
            else str(t["guaranteed_gpu_memory_gb"]),
        ]

    header = [
        "TEAM",
        "MEMBERS",
        "GPUS",
        "GPU MEMORY (GB)",
        "REPLICAS",
        "TOKENS THIS MONTH",
        "MAX PRIORITY",
        "GUARANTEED (GB)",
    ]
    empty = "no teams: every model and key is the fleet's"
    return _listing(api, args, out, "teams/", empty, header, row)


def _adapters(api: Api, args, out):
    def row(a) -> list[str]:
        where = [
            f"{w['node']} ({w['state']})" + (f": {w['error'][:60]}" if w.get("error") else "")
            for w in a.get("loaded") or []
        ]
        return [a["name"], a["model_name"], a["source"][:60], ", ".join(where) or "-"]

    header = ["ADAPTER", "MODEL", "SOURCE", "LOADED ON"]
    empty = "no adapters: declare them under their model (llmgw apply -f catalog.yaml)"
    return _listing(api, args, out, "adapters/", empty, header, row)


def _all_pages(api: Api, path: str) -> list:
    page = api.call("GET", path)
    if isinstance(page, list):
        return page
    items = list(page.get("results", []))
    while page.get("next"):
        nxt = urllib.parse.urlsplit(page["next"])
        page = api.call(
            "GET", nxt.path.split("/api/v1/", 1)[1] + (f"?{nxt.query}" if nxt.query else "")
        )
        items += page.get("results", [])
    return items


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _weights(api: Api, args, out):
    query = []
    if args.node:
        query.append(f"node={_quote(args.node)}")
    if args.unused:
        query.append("unused=true")
    rows = _all_pages(api, "weights/" + (f"?{'&'.join(query)}" if query else ""))
    if args.json:
        return rows
    if not rows:
        out.write("no weights" + (" unused" if args.unused else "") + " on record\n")
        return None
    table = [["NODE", "PATH", "SIZE", "UNUSED SINCE", "IN USE BY", "PINNED"]]
    for r in rows:
        table.append(
            [
                r["node"],
                r["path"],
                _size(r["size_bytes"]),
                "in use now" if r["in_use_by"] else (r.get("unused_since") or "-"),
                ", ".join(r["in_use_by"]) or "-",
                "yes" if r["pinned"] else "no",
            ]
        )
    _table(table, out)
    return None


def _gc_weights(api: Api, args, out):
    report = api.call("GET" if args.dry_run else "POST", "weights/cleanup/")
    if args.json:
        return report
    if report.get("skipped"):
        raise Failure("a reconciler pass held the lock; try again", EXIT_REFUSED)
    for p in report["proposals"]:
        out.write(f"{p['node']} {p['path']} ({_size(p['size_bytes'])}): {p['reason']}\n")
    for p in report["refused"]:
        out.write(f"{p['node']} {p['path']}: kept although asked for: {p['reason']}\n")
    for p in report.get("waiting", []):  # absent from a control plane before it
        out.write(f"{p['node']} {p['path']}: asked for, not yet: {p['reason']}\n")
    verb = "would propose" if args.dry_run else "proposed"
    out.write(f"{verb} {len(report['proposals'])} for removal\n")
    return None


def _read_file(path: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise Failure(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None


def _apply(api: Api, args, out):
    text = _read_file(args.file)
    try:
        result = api.call("POST", "catalog/apply/", {"catalog": text, "dry_run": args.dry_run})
    except Failure as exc:
        if exc.code == EXIT_REFUSED:
            raise Failure(
                f"{args.file}: nothing applied:\n{_indent(str(exc))}", EXIT_REFUSED
            ) from None
        raise
    if args.json:
        return result
    prefix = "would change: " if args.dry_run else ""
    for line in result["changes"]:
        out.write(prefix + line + "\n")
    if not result["changes"]:
        out.write("nothing to change\n")
    elif result["unchanged"]:
        out.write(f"unchanged: {', '.join(result['unchanged'])}\n")
    return None


def _explain(api: Api, args, out):
    body = {"model": args.model, "profile": args.profile or ""}
    if args.file:
        body["catalog"] = _read_file(args.file)
    result = api.call("POST", "catalog/explain/", body)
    if args.json:
        return result
    for line in result["lines"]:
        out.write(line + "\n")
    return None


def _intent(verb: str):
    def run(api: Api, args, out):
        node = api.call("POST", f"nodes/{_quote(args.node)}/{verb}/")
        if verb == "drain" and getattr(args, "wait", False):
            node = _wait_drained(api, args.node, args.timeout, out if not args.json else None)
        if args.json:
            return node
        out.write(f"{node['id']}: {_intent_text(node)}\n")
        return None

    return run


def _replica(api: Api, args, out):
    """``llmgw replica drain qwen#1381a499``: the id, or the part after '#', unique."""
    given = args.replica.rsplit("#", 1)[-1]
    found = _all_pages(api, f"replicas/?id__startswith={_quote(given)}")
    live = [r for r in found if r["state"] != "stopped"] or found
    if len(live) != 1:
        which = ", ".join(f"{r['model_name']}#{r['id']}" for r in live[:5])
        raise Failure(
            f"'{args.replica}' names {len(live)} replicas{': ' + which if which else ''}; "
            "give more of its id (llmgw node NODE --json lists them)",
            EXIT_USAGE,
        )
    result = api.call("POST", f"replicas/{live[0]['id']}/{args.verb}/")
    if args.json:
        return result
    out.write(result["detail"] + "\n")
    return None


def _canary(api: Api, args, out):
    """``llmgw canary promote qwen --why "p95 within bounds"``."""
    found = _all_pages(api, f"models/?name={_quote(args.model)}")
    if not found:
        raise Failure(f"no model named '{args.model}'", EXIT_REFUSED)
    path = "promote" if args.verb == "promote" else "abort-canary"
    body = {"why": args.why} if args.why else {}
    result = api.call("POST", f"models/{found[0]['id']}/{path}/", body)
    if args.json:
        return result
    out.write(result["detail"] + "\n")
    return None


def _node_notice(api: Api, args, out):
    """``llmgw node notice gpu-07 --in 2m --reason "spot reclaim"``."""
    try:
        in_s = notice_seconds(args.in_)
    except ValueError as exc:
        raise Failure(str(exc), EXIT_USAGE) from None
    body = {"in_s": in_s, **({"reason": args.reason} if args.reason else {})}
    result = api.call("POST", f"nodes/{_quote(args.notice_node)}/notice/", body)
    if args.json:
        return result
    out.write(result["detail"] + "\n")
    return None


def gpu_name(name: str) -> tuple[str, int]:
    """'gpu-07/3' (or 'gpu-07/gpu3', as pages print it) -> ('gpu-07', 3)."""
    node, _, index = name.rpartition("/")
    index = index.removeprefix("gpu")
    if not node or not index.isdigit():
        raise Failure(f"'{name}' is not a GPU: name it NODE/INDEX, like gpu-07/3", EXIT_USAGE)
    return node, int(index)


def _gpu(api: Api, args, out):
    """``llmgw gpu clear gpu-07/3 --reason "reset, ran dcgmi diag -r 3 clean"``."""
    if not args.reason.strip():
        raise Failure(
            "say why the GPU is fine again (--reason): the audit trail keeps it", EXIT_USAGE
        )
    node, index = gpu_name(args.gpu)
    found = _all_pages(api, f"gpus/?node={_quote(node)}&index={index}")
    if not found:
        raise Failure(f"no GPU {index} on node '{node}'", EXIT_REFUSED)
    result = api.call("POST", f"gpus/{found[0]['id']}/clear/", {"reason": args.reason})
    if args.json:
        return result
    out.write(result["detail"] + "\n")
    return None


def _intent_text(node: dict) -> str:
    if node.get("draining"):
        return "draining (cordoned; its replicas move elsewhere)"
    if node.get("cordoned"):
        return "cordoned (no new placements)"
    return "takes placements"


def _wait_drained(api: Api, node_id: str, timeout: float, out) -> dict:
    """Until no shard that should run is left on the node (its replicas moved)."""
    deadline = time.monotonic() + timeout
    while True:
        shards = _all_pages(api, f"shards/?node={_quote(node_id)}&desired_state=running")
        node = api.call("GET", f"nodes/{_quote(node_id)}/")
        if not shards:
            if out is not None:
                out.write(f"{node_id}: drained, nothing runs there\n")
            return node
        if time.monotonic() >= deadline:
            raise Failure(
                f"{node_id}: still {len(shards)} shard(s) running after {timeout:g} s; "
                "the drain goes on (llmgw node to follow it)",
                EXIT_TIMEOUT,
            )
        time.sleep(1)


def _logs(api: Api, args, out):
    reply = api.call(
        "GET", f"nodes/{_quote(args.node)}/logs/", source=args.shard or "agent", lines=args.lines
    )
    if args.json:
        return reply
    for line in reply["lines"]:
        out.write(line + "\n")
    if reply.get("error"):
        raise Failure(
            f"{args.node}: {reply['error']} (sources: {', '.join(reply['sources'])})", EXIT_REFUSED
        )
    return None


def _revoke(api: Api, args, out):
    if not args.yes:
        raise Failure(
            f"revoking {args.node} disconnects its agent, which must enrol again with a new "
            "join token: add --yes to do it",
            EXIT_USAGE,
        )
    result = api.call("POST", f"nodes/{_quote(args.node)}/revoke/")
    if args.json:
        return result
    out.write(
        f"{args.node}: {result['revoked']} credential(s) revoked; its agent is disconnected\n"
    )
    return None


def _secret(path: str, fields):
    def run(api: Api, args, out):
        made = api.call("POST", path, fields(args))
        if args.json:
            return made
        expiry = made.get("expires_at") or "never"
        args.err.write(
            f"'{made['name']}' ({made['prefix']}), expires {expiry}. "
            "The secret is shown only once:\n"
        )
        out.write(made["secret"] + "\n")
        return None

    return run


def _rotate(api: Api, args, out):
    made = api.call("POST", f"api-keys/{_quote(args.prefix)}/rotate/", {"grace": args.grace})
    if args.json:
        return made
    args.err.write(
        f"'{made['name']}' ({made['prefix']}) rotated; the old secret works until "
        f"{made.get('old_secret_until') or 'now'}. The new secret is shown only once:\n"
    )
    out.write(made["secret"] + "\n")
    return None


def _revoke_key(api: Api, args, out):
    if not args.yes:
        raise Failure(
            f"revoking key {args.prefix} refuses it from now on and cannot be undone: "
            "add --yes to do it",
            EXIT_USAGE,
        )
    result = api.call("POST", f"api-keys/{_quote(args.prefix)}/revoke/")
    if args.json:
        return result
    done = "revoked" if result["revoked"] else "was already revoked"
    out.write(f"'{result['name']}' ({result['prefix']}) {done}\n")
    return None


def _usage(api: Api, args, out):
    rows = api.call("GET", "usage/", key=args.key, model=args.model, since=args.since)
    if args.json:
        return rows
    if not rows:
        args.err.write(f"no usage in the last {args.since}\n")
        return None
    head = ["KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION"]
    if args.hourly:
        table = [["HOUR (UTC)", *head]] + [
            [r["hour"][:13].replace("T", " ") + ":00", r["key"], r["model"], str(r["requests"]),
             str(r["prompt_tokens"]), str(r["completion_tokens"])]
            for r in rows
        ]  # fmt: skip
    else:
        totals: dict[tuple[str, str], list[int]] = {}
        for r in rows:
            t = totals.setdefault((r["key"], r["model"]), [0, 0, 0])
            t[0] += r["requests"]
            t[1] += r["prompt_tokens"]
            t[2] += r["completion_tokens"]
        table = [head] + [[k, m, *map(str, t)] for (k, m), t in sorted(totals.items())]
    _table(table, out)
    return None


def _through(text: str | None) -> str | None:
    """--to as the API's end: a date is through that day (the next midnight); a time as
    it is."""
    import datetime

    try:
        day = datetime.date.fromisoformat(text or "")
    except ValueError:
        return text
    return (day + datetime.timedelta(days=1)).isoformat()


def _costs(api: Api, args, out):
    query = {"start": args.from_, "end": _through(args.to), "by": args.by}
    if args.csv:
        out.write(api.call("GET", "costs/", accept="text/csv", **query))
        return None
    found = api.call("GET", "costs/", **query)
    if args.json:
        return found
    period = f"{found['start'][:16].replace('T', ' ')} to {found['end'][:16].replace('T', ' ')}"
    args.err.write(f"costs from {period} UTC, of {found['seen']}\n")
    by = found["by"]
    head = [b.upper().replace("_", " ") for b in by]
    table = [[*head, "GPU-HOURS", "COST", "TOKENS", "PER 1M TOKENS", "UTILISATION"]]

    def figures(r) -> list[str]:
        per_m, use = r["cost_per_million_tokens"], r["utilisation"]
        return [
            f"{r['gpu_hours']:,.1f}",
            f"{_money(r['cost'])} {r['currency']}",
            f"{r['tokens']:,}" if not r["idle"] else "-",
            "-" if per_m is None else f"{_money(per_m)} {r['currency']}",
            "-" if use is None else f"{use:.0%}",
        ]

    for r in found["rows"]:
        names = [(r[b] if b != "team" else r[b] or "(fleet)") or "-" for b in by]
        table.append([*names, *figures(r)])
    for r in found["idle"]:
        gpu = r["gpu_class"] or "CPU-only nodes"
        table.append([f"idle ({gpu})", *["" for _ in by[1:]], *figures(r)])
    for r in found["totals"]:
        table.append(["total", *["" for _ in by[1:]], *figures(r)])
    if len(table) == 1:
        args.err.write("no costs counted in that period\n")
        return None
    _table(table, out)
    if found["unpriced"]:
        args.err.write(f"no price for: {', '.join(found['unpriced'])} (costed at 0)\n")
    return None


def _money(text) -> str:
    """A decimal the API sends as text, to two places: '12.345600' -> '12.35'."""
    return f"{float(text):,.2f}"


_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _ago(text: str) -> str:
    """'24h', '7d' … as the ISO 8601 time that long ago (UTC); an ISO time as it is."""
    number, unit = text[:-1], text[-1:]
    if unit in _UNITS_S and number.isdigit():
        when = time.time() - int(number) * _UNITS_S[unit]
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    return text


def notice_seconds(text: str) -> float:
    """A notice's time ahead: '120' (seconds), '120s', '2m', '1h'. ValueError naming it.
    ``manage.py notice`` reads ``--in`` with this too."""
    given = str(text).strip().lower()
    number, unit = (given[:-1], given[-1]) if given[-1:] in _UNITS_S else (given, "s")
    try:
        seconds = float(number.strip()) * _UNITS_S[unit]
    except ValueError:
        seconds = -1.0
    if not number.strip() or not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"--in '{text}' is not a time ahead: give seconds (120) or 120s, 2m, 1h")
    return seconds


def _change(field: str, said) -> str:
    """One field's change: 'before → after', or for a many-to-many 'add: a, b'."""
    if isinstance(said, dict):  # {"type": "m2m", "operation": "add", "objects": [...]}
        objects = ", ".join(map(str, said.get("objects", [])))
        return f"{field} {said.get('operation', '?')}: {objects}"
    before, after = said
    return f"{field}: {before} → {after}"


def _audit(api: Api, args, out):
    page = api.call(
        "GET",
        "audit/",
        limit=args.limit,
        actor=args.actor,
        door=args.door,
        object_type=args.type,
        object=args.object,
        since=_ago(args.since) if args.since else None,
    )
    rows = page.get("results", []) if isinstance(page, dict) else page
    if args.json:
        return rows
    if not rows:
        args.err.write("no changes recorded that match\n")
        return None
    table = [["WHEN (UTC)", "WHO", "DOOR", "ACTION", "OBJECT", "CHANGES"]]
    for r in rows:
        changes = ", ".join(_change(field, said) for field, said in r["changes"].items())
        table.append(
            [r["timestamp"][:19].replace("T", " "), r["actor"] or "(system)", r["door"],
             r["action"], f"{r['object_type']} {r['object_repr']}", changes[:120]]
        )  # fmt: skip
    _table(table, out)
    return None


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


# ---- the command line -----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw",
        description="The llmgw fleet through its management API (a manage key).",
        epilog="Connects to --url / LLMGW_URL with LLMGW_API_KEY, or with "
        f"{CONFIG_PATH} (url:, api_key:; mode 600).",
    )
    p.add_argument("--url", help="The control plane, e.g. https://llmgw.example.com")
    p.add_argument("--config", help=f"A config file instead of {CONFIG_PATH}")
    p.add_argument("--json", action="store_true", help="Print the API's JSON, for scripts.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("nodes", help="The node table: state, CPU, memory, GPUs, engines, shards.")
    n = sub.add_parser(
        "node",
        help="One node in full; or 'node notice NODE --in 2m': NODE goes away then.",
        usage="llmgw node NODE\n       llmgw node notice NODE --in TIME [--reason TEXT]",
        description="Show NODE; or say NODE goes away in TIME: it drains now, "
        "replacements first (docs/operations.md, 'GPU faults and notices').",
    )
    n.add_argument("node", metavar="NODE")
    n.add_argument("notice_node", nargs="?", metavar="NODE", help=argparse.SUPPRESS)
    n.add_argument("--in", dest="in_", metavar="TIME", help="notice: 120, 120s, 2m or 1h.")
    n.add_argument(
        "--reason", default="", metavar="TEXT", help="notice: said on the node page and the event."
    )
    gp = sub.add_parser(
        "gpu",
        help="Clear a GPU's fault, with a reason: placed on again.",
        usage="llmgw gpu clear NODE/INDEX --reason TEXT",
    )
    gp.add_argument("verb", choices=["clear"])
    gp.add_argument("gpu", metavar="NODE/INDEX", help="Like gpu-07/3.")
    gp.add_argument(
        "--reason", required=True, metavar="TEXT", help="Why it is fine again (kept in the audit)."
    )
    sub.add_parser("models", help="The catalog's models.")
    sub.add_parser("teams", help="Teams: members, and what they hold against their quotas.")
    sub.add_parser("adapters", help="LoRA adapters, their models and where they are loaded.")
    e = sub.add_parser("explain", help="Why a new replica of MODEL could run on each node.")
    e.add_argument("model")
    e.add_argument("--profile", help="Ask about this profile instead of the active one.")
    e.add_argument("-f", "--file", help="A catalog file to consider applied first (what if).")
    a = sub.add_parser("apply", help="Apply a catalog file: all of it, or nothing.")
    a.add_argument("-f", "--file", required=True, help="catalog.yaml, or - for stdin")
    a.add_argument("--dry-run", action="store_true", help="Say what would change only.")
    d = sub.add_parser("drain", help="Cordon NODE and move its replicas elsewhere.")
    d.add_argument("node")
    d.add_argument("--wait", action="store_true", help="Return once nothing runs there.")
    d.add_argument("--timeout", type=float, default=600, help="For --wait, in seconds.")
    for verb, what in (("cordon", "No new placements on NODE."), ("uncordon", "Placements again.")):
        c = sub.add_parser(verb, help=what)
        c.add_argument("node")
    r = sub.add_parser("revoke", help="Revoke NODE's credentials and disconnect its agent.")
    r.add_argument("node")
    r.add_argument("--yes", action="store_true", help="Yes, its agent must enrol again.")
    rp = sub.add_parser(
        "replica",
        help="Drain (a replacement first), stop (one fewer) or restart one replica.",
    )
    rp.add_argument("verb", choices=["drain", "stop", "restart"])
    cn = sub.add_parser("canary", help="Promote MODEL's canary to its active profile, or abort it.")
    cn.add_argument("verb", choices=["promote", "abort"])
    cn.add_argument("model")
    cn.add_argument("--why", help="Said in the event.")
    rp.add_argument("replica", help="Its id, or MODEL#ID as events and pages print it.")
    j = sub.add_parser("join-token", help="A join token for enrolling nodes (secret printed once).")
    j.add_argument("name")
    j.add_argument("--ttl", default="24h", help="Lifetime: 30m, 24h, 7d… (default 24h).")
    j.add_argument("--uses", type=int, default=1, help="How many nodes it may enrol.")
    k = sub.add_parser("api-key", help="A gateway or management-API key (secret printed once).")
    k.add_argument("name")
    k.add_argument("--scope", choices=["inference", "manage"], default="inference")
    k.add_argument("--models", default="", help="Inference keys: a,b (default: every model).")
    k.add_argument(
        "--fallbacks",
        default="",
        help="Inference keys: a,b to answer in order when the model asked for cannot.",
    )
    k.add_argument("--expires", help="30d, 12h… or an ISO 8601 time.")
    k.add_argument(
        "--max-concurrent", type=int, help="Requests in flight at once; more wait. 0: no bound."
    )
    k.add_argument(
        "--share-weight", type=int, help="Its share (1-100) when a model is busy (default 1)."
    )
    k.add_argument(
        "--user",
        help="Whose key it is (default: yours, the manage key's user); another user's "
        "needs the permission fleet.manage_others_api_keys.",
    )
    k.add_argument("--team", help="The team that owns it (default: yours, if you are in one).")
    rk = sub.add_parser("revoke-key", help="Refuse an API key from now on (cannot be undone).")
    rk.add_argument("prefix", help="The key's prefix (the 8 characters after lgk_).")
    rk.add_argument("--yes", action="store_true", help="Yes, refuse it from now on.")
    r = sub.add_parser("rotate-key", help="A new secret for a key; the old one works for --grace.")
    r.add_argument("prefix", help="The key's prefix (the 8 characters after lgk_).")
    r.add_argument("--grace", default="24h", help="How long the old secret still works.")
    u = sub.add_parser("usage", help="Tokens per key and model, from the gateways' counts.")
    u.add_argument("--key", help="A key's prefix or name.")
    u.add_argument("--model", help="One model.")
    u.add_argument("--since", default="7d", help="How far back: 24h, 7d… (default 7d).")
    u.add_argument("--hourly", action="store_true", help="One line per hour, not totals.")
    c = sub.add_parser("costs", help="What the fleet cost, by team and model, with the idle apart.")
    c.add_argument(
        "--from",
        dest="from_",
        metavar="DATE",
        help="2026-11-01 or an ISO time (UTC); default: this month's start.",
    )
    c.add_argument("--to", metavar="DATE", help="The last day, included, or a time (default: now).")
    c.add_argument(
        "--by", default="team,model", help="team, model, gpu_class or several, comma-separated."
    )
    c.add_argument("--csv", action="store_true", help="The rows as CSV, for a spreadsheet.")
    a = sub.add_parser("audit", help="Who changed what, when and through which door; newest first.")
    a.add_argument("--actor", help="One user's changes.")
    a.add_argument("--door", help="admin, console, api, llmgw, 'manage.py CMD' or system.")
    a.add_argument("--type", help="What was changed: model, node, apikey, engineprofile …")
    a.add_argument("--object", help="One object's changes, by its id (a node's name).")
    a.add_argument("--since", help="How far back: 24h, 7d… or an ISO 8601 time.")
    a.add_argument("--limit", type=int, default=50, help="How many (default 50).")
    b = sub.add_parser("engine-build", help="Which vLLM build NODE installs (docs/engines.md).")
    b.add_argument("node")
    b.add_argument("build", choices=["auto", "cu13", "cu129", "none"])
    w = sub.add_parser("weights", help="Weights on nodes: size, last use, what uses them.")
    w.add_argument("--node", help="Only this node's.")
    w.add_argument("--unused", action="store_true", help="Only what no shard needs.")
    gw = sub.add_parser("gc-weights", help="Run the weights clean-up now (docs/weights.md).")
    gw.add_argument("--dry-run", action="store_true", help="Print what would go, and why.")
    g = sub.add_parser("logs", help="The last lines of NODE's agent log, or of a shard's.")
    g.add_argument("node")
    g.add_argument("--shard", help="A shard's id (llmgw node NODE --json lists them).")
    g.add_argument("-n", "--lines", type=int, default=200, help="How many (1-2000).")
    return p


COMMANDS = {
    "nodes": _nodes,
    "node": _node_or_notice,
    "gpu": _gpu,
    "models": _models,
    "teams": _teams,
    "adapters": _adapters,
    "explain": _explain,
    "apply": _apply,
    "drain": _intent("drain"),
    "cordon": _intent("cordon"),
    "uncordon": _intent("uncordon"),
    "replica": _replica,
    "canary": _canary,
    "logs": _logs,
    "revoke": _revoke,
    "engine-build": _engine_build,
    "rotate-key": _rotate,
    "usage": _usage,
    "costs": _costs,
    "audit": _audit,
    "weights": _weights,
    "gc-weights": _gc_weights,
    "join-token": _secret("join-tokens/", lambda a: {"name": a.name, "ttl": a.ttl, "uses": a.uses}),
    "api-key": _secret(
        "api-keys/",
        lambda a: {
            "name": a.name,
            "scope": a.scope,
            "models": [m.strip() for m in a.models.split(",") if m.strip()],
            "fallbacks": [m.strip() for m in a.fallbacks.split(",") if m.strip()],
            **({"expires": a.expires} if a.expires else {}),
            **({"max_concurrent": a.max_concurrent} if a.max_concurrent is not None else {}),
            **({"share_weight": a.share_weight} if a.share_weight is not None else {}),
            **({"user": a.user} if a.user else {}),
            **({"team": a.team} if a.team else {}),
        },
    ),
    "revoke-key": _revoke_key,
}


def main(argv: list[str] | None = None, out=None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = _parser().parse_args(argv)
    args.err = err
    try:
        api = Api(*_settings(args))
        result = COMMANDS[args.command](api, args, out)
        if args.json and result is not None:
            out.write(json.dumps(result, indent=2) + "\n")
        return EXIT_OK
    except Failure as exc:
        err.write(f"llmgw {args.command}: {exc}\n")
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
