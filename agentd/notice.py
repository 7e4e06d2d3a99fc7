"""A node's notice of going away: its cloud's metadata service, or a file, polled.

Each source is one row of ``SOURCES``: the metadata service's address, what
to ask it (a path, the headers it insists on) and a parser from its answer
to a ``Notice`` (when the machine goes, and why) or None. The parsers are
pure and tested with the clouds' own example answers:

- ``aws``: ``/latest/meta-data/spot/instance-action``, 404 until EC2 decides to
  reclaim a Spot instance, then ``{"action": "terminate", "time": "…Z"}`` two
  minutes ahead. IMDSv2: a token from ``PUT /latest/api/token`` first.
- ``gcp``: ``instance/preempted`` turns ``TRUE`` when a Spot or preemptible VM is
  preempted (30 s before it stops), and ``instance/maintenance-event`` turns
  ``TERMINATE_ON_HOST_MAINTENANCE`` before host maintenance stops it (GPU VMs
  cannot live-migrate; 60 s is assumed, the shortest notice Compute Engine gives).
  Both want ``Metadata-Flavor: Google``.
- ``azure``: Scheduled Events, ``{"Events": [{"EventType": "Preempt", "NotBefore":
  "Mon, 19 Sep 2016 18:29:47 GMT", "Resources": [...]}]}``; Preempt, Terminate,
  Redeploy and Reboot count, for this VM (its name in ``Resources``), Freeze (a
  pause of seconds) does not. Wants ``Metadata: true``.
- ``file``: a local file whose content is a number of seconds, or ``{"in_s": N,
  "reason": "…"}``; its modification time plus ``in_s`` is the deadline, so
  reading it again does not move it.

``NoticeWatch`` keeps what holds: ``check()`` asks (blocking, off the event
loop), ``update()`` says whether the control plane must be told (a notice
first seen, or its deadline moved earlier), ``again()`` says it again after a
registration. A metadata service that does not answer changes nothing: a
notice is not withdrawn because the service hiccupped. Errors are logged once
each, never raised into the agent.

To add a cloud: a parser and a row.
"""

from __future__ import annotations

import email.utils
import json
import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from agentd import protocol

logger = logging.getLogger(__name__)

# How far ahead a preempted GCP VM is stopped, and host maintenance at the least.
GCP_PREEMPT_S = 30.0
GCP_MAINTENANCE_S = 60.0
AWS_TOKEN_TTL_S = 21600
MAX_BODY = 64 * 1024
# A deadline that moved earlier by less than this is the same one, read again.
SLACK_S = 1.0
AZURE_COUNTED = ("Preempt", "Terminate", "Redeploy", "Reboot")


@dataclass(frozen=True)
class Notice:
    deadline: float  # when the machine goes, as time.time() counts
    reason: str


class NoticeError(ValueError):
    """An answer that cannot be read. The message says what was wrong."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: str


@dataclass(frozen=True)
class Probe:
    """One request: a path under the service's base URL, its headers, its parser."""

    path: str
    parse: Callable[[Answer, float, dict], Notice | None]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Source:
    name: str
    base: str  # scheme://host[:port]; agent.yaml's notice.url replaces it
    probes: tuple[Probe, ...]
    # Run before the probes with (fetch, cache): extra headers and facts for the
    # parsers (AWS's token, Azure's VM name). The cache outlives one poll.
    prepare: Callable[[Callable[..., Answer], dict], dict] | None = None


# ---- parsers (pure) ------------------------------------------------------------


def _json(answer: Answer, what: str):
    try:
        return json.loads(answer.body)
    except ValueError:
        raise NoticeError(f"{what} is not JSON: {answer.body[:80]!r}") from None


def _iso_time(text: object, what: str) -> float:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise NoticeError(f"{what}: {text!r} is not a time") from None


def _unexpected(answer: Answer, what: str) -> NoticeError:
    return NoticeError(f"{what} answered HTTP {answer.status}: {answer.body[:80]!r}")


def parse_aws_spot(answer: Answer, now: float, ctx: dict) -> Notice | None:
    """EC2's spot/instance-action: 404 while none, else the action and its time."""
    what = "AWS spot/instance-action"
    if answer.status == 404:
        return None
    if answer.status != 200:
        raise _unexpected(answer, what)
    data = _json(answer, what)
    if not isinstance(data, dict) or "action" not in data or "time" not in data:
        raise NoticeError(f"{what} lacks action or time: {answer.body[:80]!r}")
    return Notice(_iso_time(data["time"], what), f"spot instance-action {data['action']}")


def parse_gcp_preempted(answer: Answer, now: float, ctx: dict) -> Notice | None:
    what = "GCP instance/preempted"
    if answer.status != 200:
        raise _unexpected(answer, what)
    value = answer.body.strip().upper()
    if value == "FALSE":
        return None
    if value == "TRUE":
        return Notice(now + GCP_PREEMPT_S, "preempted")
    raise NoticeError(f"{what} is neither TRUE nor FALSE: {answer.body[:80]!r}")


def parse_gcp_maintenance(answer: Answer, now: float, ctx: dict) -> Notice | None:
    """NONE, or what host maintenance will do. Live migration keeps the VM: no notice."""
    what = "GCP instance/maintenance-event"
    if answer.status != 200:
        raise _unexpected(answer, what)
    value = answer.body.strip()
    if value.startswith("TERMINATE"):
        return Notice(now + GCP_MAINTENANCE_S, f"host maintenance {value}")
    return None  # NONE, MIGRATE_ON_HOST_MAINTENANCE


def _azure_time(text: object) -> float:
    parsed = email.utils.parsedate_to_datetime(str(text))  # "Mon, 19 Sep 2016 18:29:47 GMT"
    return parsed.timestamp()


def parse_azure(answer: Answer, now: float, ctx: dict) -> Notice | None:
    """The earliest counted event for this VM; a started one (NotBefore blank) is now."""
    what = "Azure scheduledevents"
    if answer.status != 200:
        raise _unexpected(answer, what)
    data = _json(answer, what)
    if not isinstance(data, dict) or not isinstance(data.get("Events", []), list):
        raise NoticeError(f"{what} has no Events list: {answer.body[:80]!r}")
    name = ctx.get("vm_name", "")
    found: Notice | None = None
    for event in data.get("Events", []):
        if not isinstance(event, dict) or event.get("EventType") not in AZURE_COUNTED:
            continue
        resources = event.get("Resources") or []
        # Events go to every VM of an availability set or scale-set group.
        if name and resources and name not in resources:
            continue
        not_before = event.get("NotBefore") or ""
        if event.get("EventStatus") == "Started" or not not_before:
            deadline = now
        else:
            try:
                deadline = _azure_time(not_before)
            except (TypeError, ValueError):
                raise NoticeError(f"{what}: NotBefore {not_before!r} is not a time") from None
        reason = f"scheduled event {event['EventType']}"
        if event.get("Description"):
            reason += f": {event['Description']}"
        if found is None or deadline < found.deadline:
            found = Notice(deadline, reason)
    return found


def parse_file(text: str, mtime: float, path: str = "notice file") -> Notice:
    """A number of seconds, or {"in_s": N, "reason": "..."}, counted from ``mtime``."""
    text = text.strip()
    reason = f"notice file {path}"
    try:
        value = json.loads(text)
    except ValueError:
        raise NoticeError(
            f"{path}: {text[:80]!r} is neither a number of seconds nor JSON"
        ) from None
    if isinstance(value, dict):
        reason = str(value.get("reason") or reason)
        value = value.get("in_s")
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise NoticeError(f"{path}: in_s must be a number of seconds, 0 or more (got {value!r})")
    return Notice(mtime + float(value), reason)


# ---- preparing: AWS's token, Azure's name ----------------------------------------


def aws_token(fetch: Callable[..., Answer], cache: dict) -> dict:
    """IMDSv2's session token, kept until shortly before it expires. Where the PUT is
    refused (an old IMDS, or a hop limit a container hits) IMDSv1 is tried without one."""
    if cache.get("token") and cache.get("token_until", 0) > time.monotonic():
        return {"headers": {"X-aws-ec2-metadata-token": cache["token"]}}
    answer = fetch(
        "/latest/api/token",
        {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)},
        method="PUT",
    )
    if answer.status != 200 or not answer.body.strip():
        if not cache.get("v1"):
            logger.info("AWS IMDSv2 token refused (HTTP %d): asking without one", answer.status)
            cache["v1"] = True
        return {}
    cache["token"] = answer.body.strip()
    cache["token_until"] = time.monotonic() + AWS_TOKEN_TTL_S - 60
    return {"headers": {"X-aws-ec2-metadata-token": cache["token"]}}


AZURE_HEADERS = {"Metadata": "true"}


def azure_name(fetch: Callable[..., Answer], cache: dict) -> dict:
    """This VM's name, as Scheduled Events list it in Resources; the hostname if the
    metadata service will not say."""
    if "vm_name" not in cache:
        answer = fetch(
            "/metadata/instance/compute/name?api-version=2021-02-01&format=text", AZURE_HEADERS
        )
        name = answer.body.strip() if answer.status == 200 else ""
        cache["vm_name"] = name or socket.gethostname()
    return {"vm_name": cache["vm_name"]}


GCP_HEADERS = {"Metadata-Flavor": "Google"}

SOURCES: dict[str, Source] = {
    "aws": Source(
        "aws",
        "http://169.254.169.254",
        (Probe("/latest/meta-data/spot/instance-action", parse_aws_spot),),
        prepare=aws_token,
    ),
    "gcp": Source(
        "gcp",
        "http://metadata.google.internal",
        (
            Probe("/computeMetadata/v1/instance/preempted", parse_gcp_preempted, GCP_HEADERS),
            Probe(
                "/computeMetadata/v1/instance/maintenance-event",
                parse_gcp_maintenance,
                GCP_HEADERS,
            ),
        ),
    ),
    "azure": Source(
        "azure",
        "http://169.254.169.254",
        (Probe("/metadata/scheduledevents?api-version=2020-07-01", parse_azure, AZURE_HEADERS),),
        prepare=azure_name,
    ),
}
FILE_SOURCE = "file"
NAMES = (*SOURCES, FILE_SOURCE)


# ---- asking -----------------------------------------------------------------------

# Straight to the metadata service: never through an http_proxy from the environment.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(base: str, timeout_s: float) -> Callable[..., Answer]:
    """A fetch of paths under ``base``: the status and body, an HTTP error included;
    unreachable raises OSError."""

    def fetch(path: str, headers: dict[str, str], method: str = "GET") -> Answer:
        req = urllib.request.Request(base + path, headers=headers, method=method)
        try:
            with _opener.open(req, timeout=timeout_s) as resp:
                return Answer(resp.status, resp.read(MAX_BODY).decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            body = exc.read(MAX_BODY).decode("utf-8", "replace") if exc.fp else ""
            return Answer(exc.code, body)

    return fetch


class Unknown:
    """check()'s answer when the source could not be read: nothing changes."""


UNKNOWN = Unknown()


class NoticeWatch:
    """What one source says, and what the control plane has been told of it."""

    def __init__(
        self,
        source: str,
        url: str = "",
        file: Path | None = None,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ):
        if source not in NAMES:
            raise ValueError(f"unknown notice source {source!r} (known: {', '.join(NAMES)})")
        self.name = source
        self.file = file
        self.clock = clock
        self.row = SOURCES.get(source)
        self.base = (url or (self.row.base if self.row else "")).rstrip("/")
        self.fetch = http(self.base, timeout_s)
        self.cache: dict = {}
        self.current: Notice | None = None  # the notice that holds, earliest deadline seen
        self.told: float | None = None  # the deadline the control plane was last told
        self._logged = ""
        self._far: float | None = None  # a deadline over a week ahead, logged once

    def describe(self) -> str:
        if self.name == FILE_SOURCE:
            return f"file {self.file}"
        return f"{self.name} at {self.base}"

    # ---- blocking: call off the event loop ----------------------------------------

    def check(self) -> Notice | None | Unknown:
        """What the source says now: a notice, None, or UNKNOWN when it could not be read
        (logged once per new error)."""
        try:
            found = self._read()
        except NoticeError as exc:
            self._log(f"notice source {self.describe()}: {exc}")
            return UNKNOWN
        except OSError as exc:  # unreachable, timed out, unreadable file
            reason = getattr(exc, "reason", None) or exc.strerror or exc
            self._log(f"notice source {self.describe()} cannot be read: {reason}")
            return UNKNOWN
        if self._logged:
            logger.info("notice source %s answers again", self.describe())
            self._logged = ""
        return found

    def _log(self, text: str) -> None:
        if text != self._logged:
            logger.warning("%s; asking again", text)
            self._logged = text

    def _read(self) -> Notice | None:
        now = self.clock()
        if self.name == FILE_SOURCE:
            try:
                st = self.file.stat()
                text = self.file.read_text(errors="replace")[:MAX_BODY]
            except FileNotFoundError:
                return None
            return parse_file(text, st.st_mtime, str(self.file))
        ctx = self.row.prepare(self.fetch, self.cache) if self.row.prepare else {}
        found: Notice | None = None
        for probe in self.row.probes:
            answer = self.fetch(probe.path, {**probe.headers, **ctx.get("headers", {})})
            if answer.status == 401 and "token" in self.cache:
                self.cache.pop("token")  # expired or revoked: a new one next time
            notice = probe.parse(answer, now, ctx)
            if notice is not None and (found is None or notice.deadline < found.deadline):
                found = notice
        return found

    # ---- on the event loop ----------------------------------------------------------

    def update(self, found: Notice | None | Unknown) -> protocol.NodeNotice | None:
        """What to tell the control plane after ``check()``: a notice first seen, or one
        whose deadline moved earlier; None otherwise."""
        if isinstance(found, Unknown):
            return None
        if found is None:
            if self.current is not None:
                # The protocol has no withdrawal: the node stays drained until an
                # operator uncordons it, which ends the control plane's notice too.
                logger.warning(
                    "notice withdrawn by %s (%s); uncordon the node to use it again",
                    self.describe(),
                    self.current.reason,
                )
            self.current, self.told = None, None
            return None
        if self.current is not None and self.current.deadline <= found.deadline:
            found = self.current  # read again (GCP's "now + 30 s" moves on): the first holds
        self.current = found
        if self.told is not None and found.deadline >= self.told - SLACK_S:
            return None
        return self._message(first=self.told is None)

    def again(self) -> protocol.NodeNotice | None:
        """After a registration: the notice that still holds, told again."""
        if self.current is None or self.told is None:
            return None
        return self._message(first=False, quiet=True)

    def _message(self, first: bool, quiet: bool = False) -> protocol.NodeNotice | None:
        notice = self.current
        in_s = max(0.0, notice.deadline - self.clock())
        if in_s > protocol.NOTICE_MAX_S:
            if self._far != notice.deadline:
                self._far = notice.deadline
                logger.info(
                    "notice from %s is %.0f s ahead, more than a week: told when nearer",
                    self.describe(),
                    in_s,
                )
            return None
        if not quiet:
            logger.warning(
                "this node goes away in %.0f s (%s: %s)%s",
                in_s,
                self.name,
                notice.reason,
                "" if first else ": sooner than last said",
            )
        self.told = notice.deadline
        return protocol.NodeNotice(
            type="node_notice", in_s=round(in_s, 3), source=self.name, reason=notice.reason[:255]
        )
