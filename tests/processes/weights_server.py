"""A weights server for tests: files over HTTP(S) with Range, a throttle, and the hub's API.

It runs in a thread of the test process; agents in other processes fetch from
it. ``sent[path]`` counts the body bytes it wrote per path, which is how a test
tells a resumed download from a restarted one (``sent_once_done`` for the
final count). ``rate`` (bytes per second, 0:
unlimited) slows every body down so a test can act mid-download; ``fail_next``
makes the next GET of a path answer a status instead.

The hub part answers what ``agentd.fetch.hub`` asks of huggingface_hub, as the
Hugging Face hub does: ``GET /api/models/{repo}/revision/{rev}`` (``?blobs=true``:
sizes, git object ids, LFS sha256) and ``HEAD``/``GET
/{repo}/resolve/{commit}/{file}`` with ``X-Repo-Commit``, ``ETag`` and, for LFS
files, ``X-Linked-Etag``/``X-Linked-Size``.
"""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

CHUNK = 8192


class HubRepo:
    def __init__(self, repo: str, files: dict[str, bytes], commit: str = "c0ffee" * 6 + "abcd"):
        self.repo, self.files, self.commit = repo, files, commit

    def info(self) -> dict:
        siblings = []
        for name, data in sorted(self.files.items()):
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
            entry = {"rfilename": name, "size": len(data), "blobId": blob}
            if name.endswith((".gguf", ".safetensors", ".bin")):
                entry["lfs"] = {
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "pointerSize": 134,
                }
            siblings.append(entry)
        return {"id": self.repo, "modelId": self.repo, "sha": self.commit, "siblings": siblings}


class WeightsServer:
    def __init__(self, *, tls: tuple[str, str] | None = None):
        self.files: dict[str, bytes] = {}
        self.repos: dict[str, HubRepo] = {}
        self.sent: Counter[str] = Counter()
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Range header)
        self.rate = 0
        self.fail_next: dict[str, int] = {}
        self.corrupt: set[str] = set()  # paths served with a flipped byte
        self.declared: dict[str, int] = {}  # path -> the size a HEAD claims instead
        self.ignore_range = False  # answer every GET with the whole file, as some CDNs do
        self.active = 0  # bodies being sent now, and the most at once
        self.max_active = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                server._handle(self, head=True)

            def do_GET(self):
                server._handle(self, head=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def sent_once_done(self, path: str, timeout: float = 10.0) -> int:
        """``sent[path]`` once no body is being sent: a client can have read a body's
        last chunk before the thread that wrote it has counted it."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self.active:
                    return self.sent[path]
            if time.monotonic() > deadline:
                raise AssertionError(f"still sending after {timeout:g} s")
            time.sleep(0.01)

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- serving ---------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        parts = urlsplit(h.path)
        path = unquote(parts.path)
        with self._lock:
            self.requests.append(("HEAD" if head else "GET", path, h.headers.get("Range", "")))
            status = None if head else self.fail_next.pop(path, None)
        if status is not None:
            return self._plain(h, status, b"failing on purpose\n", head)
        if path.startswith("/api/models/"):
            return self._model_info(h, path[len("/api/models/") :], head)
        if "/resolve/" in path:
            repo, _, rest = path.lstrip("/").partition("/resolve/")
            hub = self.repos.get(repo)
            commit, _, name = rest.partition("/")
            if hub is None or commit not in (hub.commit, "main") or name not in hub.files:
                return self._plain(
                    h, 404, b"Entry not found\n", head, {"X-Error-Code": "EntryNotFound"}
                )
            data = hub.files[name]
            info = next(s for s in hub.info()["siblings"] if s["rfilename"] == name)
            extra = {"X-Repo-Commit": hub.commit, "ETag": f'"{info["blobId"]}"'}
            if "lfs" in info:
                extra["X-Linked-Etag"] = f'"{info["lfs"]["sha256"]}"'
                extra["X-Linked-Size"] = str(len(data))
            return self._body(h, path, data, head, extra)
        data = self.files.get(path.lstrip("/"))
        if data is None:
            return self._plain(h, 404, b"no such file\n", head)
        return self._body(h, path, data, head)

    def _model_info(self, h, rest: str, head: bool) -> None:
        repo, _, revision = rest.partition("/revision/")
        hub = self.repos.get(repo)
        if hub is None:
            body = json.dumps({"error": "Repository not found"}).encode()
            return self._plain(h, 404, body, head, {"X-Error-Code": "RepoNotFound"})
        if revision and unquote(revision) not in ("main", hub.commit):
            body = json.dumps({"error": f"Invalid rev id: {revision}"}).encode()
            return self._plain(h, 404, body, head, {"X-Error-Code": "RevisionNotFound"})
        body = json.dumps(hub.info()).encode()
        return self._plain(h, 200, body, head, {"Content-Type": "application/json"})

    def _plain(self, h, status: int, body: bytes, head: bool, extra=None) -> None:
        h.send_response(status)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _body(self, h, path: str, data: bytes, head: bool, extra=None) -> None:
        if path in self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start, end = 0, len(data) - 1
        rng = h.headers.get("Range", "")
        status = 200
        if rng.startswith("bytes=") and not head and not self.ignore_range:
            first, _, last = rng[len("bytes=") :].partition("-")
            start = int(first or 0)
            # A range past the end is cut to the file (RFC 9110), as a header read asks for more.
            end = min(int(last), len(data) - 1) if last else len(data) - 1
            if start >= len(data):
                return self._plain(h, 416, b"", head, {"Content-Range": f"bytes */{len(data)}"})
            status = 206
        h.send_response(status)
        length = self.declared.get(path) if head and path in self.declared else end - start + 1
        h.send_header("Content-Length", str(length))
        h.send_header("Accept-Ranges", "bytes")
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        pos = start
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            while pos <= end:
                chunk = data[pos : min(pos + CHUNK, end + 1)]
                h.wfile.write(chunk)
                with self._lock:
                    self.sent[path] += len(chunk)
                pos += len(chunk)
                if self.rate:
                    time.sleep(len(chunk) / self.rate)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        finally:
            with self._lock:
                self.active -= 1
