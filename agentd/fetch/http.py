"""One file over HTTP(S), resumed from what is already on disk, in a worker thread.

Blocking on purpose (urllib, the standard library): the fetcher runs it with
``asyncio.to_thread`` and stops it through a ``threading.Event`` checked
between chunks, and a read that gets nothing for ``stall_s`` fails instead of
hanging. ``http_proxy``/``https_proxy`` apply as for any urllib client.
"""

from __future__ import annotations

import hashlib
import re
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urljoin, urlsplit

CHUNK = 1 << 20
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class FetchError(Exception):
    """A fetch failed; the message says what and where, for the shard's error."""


class Cancelled(Exception):
    """Nobody wants the fetch any more."""


class _Redirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http(s) only (urllib would follow one to ftp://), and keep
    the Authorization header only on the same scheme, host and port: a hub sends
    large files to a CDN, which must not see the token, and nor may anyone on the
    wire of an https -> http redirect."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        newurl = urljoin(req.full_url, newurl)
        scheme = urlsplit(newurl).scheme.lower()
        if scheme not in ("http", "https"):
            raise FetchError(
                f"{req.full_url}: redirected ({code}) to {scheme}://…; weights are fetched "
                "over http(s) only, so it was not followed"
            )
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        auth = req.unredirected_hdrs.get("Authorization")
        if new is not None and auth and _origin(newurl) == _origin(req.full_url):
            new.add_unredirected_header("Authorization", auth)
        return new


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}[scheme]


def opener(ca_file: str | None = None) -> urllib.request.OpenerDirector:
    ctx = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx), _Redirect())


def http_request(url: str, headers: dict[str, str], method: str = "GET") -> urllib.request.Request:
    req = urllib.request.Request(url, method=method)
    req.add_header("Accept-Encoding", "identity")  # the size on the wire is the file's
    for key, value in headers.items():
        if key.lower() == "authorization":
            req.add_unredirected_header("Authorization", value)
        else:
            req.add_header(key, value)
    return req


def describe_error(url: str, exc: BaseException, stall_s: float) -> str:
    host = urlsplit(url).netloc
    if isinstance(exc, urllib.error.HTTPError):
        return f"{url}: the server answered {exc.code} {exc.reason}"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"{url}: no data from {host} for {stall_s:g} s"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        if isinstance(reason, ssl.SSLError):
            return f"{url}: TLS with {host} failed: {reason.reason or reason}"
        if isinstance(reason, OSError):
            return f"{url}: cannot reach {host}: {reason.strerror or reason}"
        return f"{url}: cannot reach {host}: {reason}"
    if isinstance(exc, OSError):
        return f"{url}: {exc.strerror or exc}"
    return f"{url}: {exc}"


def size_of(url: str, headers: dict[str, str], *, op, stall_s: float) -> int | None:
    """The file's size from a HEAD request; None when the server does not say.

    A server that refuses HEAD (some signed URLs do) is not an error: the size
    is then learnt from the GET. A missing file or an unreachable host is.
    """
    try:
        with op.open(http_request(url, headers, "HEAD"), timeout=stall_s) as resp:
            length = resp.headers.get("Content-Length")
    except urllib.error.HTTPError as exc:
        if exc.code in (403, 405, 501):
            return None
        raise FetchError(describe_error(url, exc, stall_s)) from None
    except (OSError, urllib.error.URLError) as exc:
        raise FetchError(describe_error(url, exc, stall_s)) from None
    return int(length) if length and length.isdigit() else None


def download(
    url: str,
    partial: Path,
    *,
    headers: dict[str, str] | None = None,
    expected_size: int | None = None,
    op=None,
    stall_s: float = 60.0,
    cancel: threading.Event | None = None,
    on_bytes: Callable[[int], None] | None = None,
    sha256: bool = False,
) -> tuple[int, str]:
    """Download ``url`` into ``partial``, continuing from its length.

    Returns the size and, with ``sha256``, the whole file's sha256 (else ""),
    hashed as the bytes arrive (the part already on disk first) rather than in
    a second pass. A server that ignores the Range header sends the whole file
    again, and the partial file is started over. A connection that ends early
    leaves the partial file for the next try. Raises FetchError or Cancelled.
    """
    op = op or opener()
    cancel = cancel or threading.Event()
    partial.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    if expected_size is not None and have > expected_size:
        partial.unlink()  # longer than the file: not a prefix of it
        have = 0
    if expected_size is not None and have == expected_size:
        return have, sha256_of(partial, cancel) if sha256 else ""
    # The part on disk is hashed before asking for the rest: a server may drop a
    # connection left waiting while a large prefix is read back.
    prefix = hashlib.sha256() if sha256 else None
    if prefix is not None and have:
        _hash_into(prefix, partial, have, cancel)
    req = http_request(url, headers or {})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = op.open(req, timeout=stall_s)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            # The partial file is not a prefix the server can continue: start over.
            partial.unlink()
            return download(url, partial, headers=headers, expected_size=expected_size, op=op,
                            stall_s=stall_s, cancel=cancel, on_bytes=on_bytes,
                            sha256=sha256)  # fmt: skip
        raise FetchError(describe_error(url, exc, stall_s)) from None
    except (OSError, urllib.error.URLError) as exc:
        raise FetchError(describe_error(url, exc, stall_s)) from None
    with resp:
        total = _total(resp, have)
        if resp.status != 206:
            have = 0  # the server sent the whole file
        if expected_size is not None and total is not None and total != expected_size:
            raise FetchError(
                f"{url}: the server says the file has {total} bytes, expected {expected_size}"
            )
        done = have
        digest = prefix if have else (hashlib.sha256() if sha256 else None)
        if on_bytes:
            on_bytes(done)
        # Buffered writes land in order, so whatever length the file has after a
        # kill is a prefix of the file, and a resume continues from it.
        with open(partial, "r+b" if have else "wb") as out:
            out.seek(have)
            out.truncate()
            while True:
                if cancel.is_set():
                    raise Cancelled()
                try:
                    chunk = resp.read1(CHUNK)  # what has arrived: progress and cancel stay prompt
                except (OSError, urllib.error.URLError) as exc:
                    raise FetchError(describe_error(url, exc, stall_s)) from None
                if not chunk:
                    break
                out.write(chunk)
                if digest is not None:
                    digest.update(chunk)
                done += len(chunk)
                if on_bytes:
                    on_bytes(done)
    want = expected_size if expected_size is not None else total
    if want is not None and done != want:
        raise FetchError(f"{url}: the connection ended at {done} of {want} bytes")
    return done, digest.hexdigest() if digest is not None else ""


def _hash_into(digest, path: Path, length: int, cancel: threading.Event) -> None:
    """The first ``length`` bytes of a file into ``digest``."""
    with open(path, "rb") as fh:
        left = length
        while left > 0:
            if cancel.is_set():
                raise Cancelled()
            chunk = fh.read(min(CHUNK, left))
            if not chunk:
                raise FetchError(f"{path} became shorter while it was read")
            digest.update(chunk)
            left -= len(chunk)


def _total(resp, have: int) -> int | None:
    """The whole file's size, from Content-Range (206) or Content-Length (200)."""
    if resp.status == 206:
        m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
        if not m or int(m.group(1)) != have:
            raise FetchError(
                f"{resp.url}: asked for bytes {have}- and got "
                f"{resp.headers.get('Content-Range') or 'no Content-Range'}"
            )
        return int(m.group(3)) if m.group(3) != "*" else None
    length = resp.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


def sha256_of(path: Path, cancel: threading.Event | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            h.update(chunk)
    return h.hexdigest()


def git_blob_sha1_of(path: Path, cancel: threading.Event | None = None) -> str:
    """The git object id of a file's content: what a hub reports for files not in LFS."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            h.update(chunk)
    return h.hexdigest()
