"""One file over HTTP(S), resumed from what is already on disk, in a worker thread.

Blocking on purpose (urllib, the standard library): the fetcher runs it with
``asyncio.to_thread`` and stops it through a ``threading.Event`` checked
between chunks, and a read that gets nothing for ``stall_s`` fails instead of
hanging. ``http_proxy``/``https_proxy`` apply as for any urllib client.

An opener given an ``AddressGuard`` refuses to talk to internal addresses
(loopback, link-local, private, unspecified, multicast, reserved) unless the
node allows them: each connection's peer is checked once it is connected and
before a byte is sent, so a name that resolves differently between a check and
the connection (DNS rebinding) cannot pass, and every redirect's hop is a
connection of its own. Through a proxy the proxy connects, so the target's
name is resolved here and each of its addresses checked instead.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
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


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
ALLOW_KEYS = "fetch.allow_private_addresses, or its network in fetch.allow_networks"


def address_kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """What makes an address internal ("loopback", "private", …), or None for a public one."""
    for kind, internal in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),  # before private, which counts 240.0.0.0/4 too
        ("private", ip.is_private),
        ("non-public", not ip.is_global),  # shared (100.64/10), documentation, …
    ):
        if internal:
            return kind
    return None


@dataclass(frozen=True)
class AddressGuard:
    """Which addresses a URL source may be fetched from: public ones, and what the node allows.

    ``allow_private``: every address (agent.yaml's ``fetch.allow_private_addresses``).
    ``allow_networks``: these networks besides the public ones (``fetch.allow_networks``).
    """

    allow_private: bool = False
    allow_networks: tuple[Network, ...] = ()

    @classmethod
    def of(cls, allow_private: bool = False, allow_networks=()) -> AddressGuard:
        nets = tuple(ipaddress.ip_network(n, strict=False) for n in allow_networks)
        return cls(allow_private=allow_private, allow_networks=nets)

    def problem(self, address: str) -> str | None:
        """Why this node may not fetch from ``address`` (an IP literal), or None."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone is not the address
        except ValueError:
            return f"{address!r} is not an IP address"
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        if self.allow_private or any(ip in net for net in self.allow_networks):
            return None
        kind = address_kind(ip)
        return None if kind is None else f"{ip}, a {kind} address"

    def refuse(self, url: str, where: str) -> FetchError:
        return FetchError(
            f"{url}: {where}; this node fetches from internal addresses only where its "
            f"agent.yaml allows them ({ALLOW_KEYS}). Nothing was fetched"
        )


class _GuardedHTTPConnection(http.client.HTTPConnection):
    """Checks the address it connected to before anything is sent on it."""

    guard: AddressGuard
    url: str
    proxied: bool

    def connect(self) -> None:
        super().connect()
        if self.proxied:
            return  # the proxy's address, the node's own choice; the target was checked
        peer = self.sock.getpeername()[0]
        problem = self.guard.problem(peer)
        if problem is not None:
            self.close()
            host = urlsplit(self.url).hostname
            raise self.guard.refuse(self.url, f"{host} is {problem}")


class _GuardedHTTPSConnection(http.client.HTTPSConnection, _GuardedHTTPConnection):
    """HTTPS: the TCP connection is checked (above, in the MRO) before TLS starts on it."""


class _GuardedHandlers:
    def __init__(self, guard: AddressGuard):
        self.guard = guard

    def connection(self, cls, req: urllib.request.Request):
        """A factory for ``do_open``: ``cls`` connections that know what to check."""
        target = urlsplit(req.full_url)
        # A proxy (http_proxy, https_proxy) took the request's host: it connects, not us.
        proxied = (req.host or "").lower() != target.netloc.lower()
        if proxied:
            self._check_name(req.full_url, target)

        def make(host, **kwargs):
            conn = cls(host, **kwargs)
            conn.guard, conn.url, conn.proxied = self.guard, req.full_url, proxied
            return conn

        return make

    def _check_name(self, url: str, target) -> None:
        port = target.port or {"http": 80, "https": 443}.get(target.scheme, 443)
        try:
            infos = socket.getaddrinfo(target.hostname, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise FetchError(f"{url}: cannot resolve {target.hostname}: {exc}") from None
        for info in infos:
            problem = self.guard.problem(info[4][0])
            if problem is not None:
                raise self.guard.refuse(url, f"{target.hostname} resolves to {problem}")


class _GuardedHTTP(_GuardedHandlers, urllib.request.HTTPHandler):
    def __init__(self, guard: AddressGuard):
        _GuardedHandlers.__init__(self, guard)
        urllib.request.HTTPHandler.__init__(self)

    def http_open(self, req):
        return self.do_open(self.connection(_GuardedHTTPConnection, req), req)


class _GuardedHTTPS(_GuardedHandlers, urllib.request.HTTPSHandler):
    def __init__(self, guard: AddressGuard, context: ssl.SSLContext):
        _GuardedHandlers.__init__(self, guard)
        urllib.request.HTTPSHandler.__init__(self, context=context)
        self.context = context

    def https_open(self, req):
        return self.do_open(
            self.connection(_GuardedHTTPSConnection, req), req, context=self.context
        )


def opener(
    ca_file: str | None = None, guard: AddressGuard | None = None
) -> urllib.request.OpenerDirector:
    """An opener for weights; with ``guard``, one that refuses the addresses it refuses."""
    ctx = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    if guard is None:
        return urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx), _Redirect())
    return urllib.request.build_opener(_GuardedHTTP(guard), _GuardedHTTPS(guard, ctx), _Redirect())


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
