"""agent.yaml: what one node's agent needs to know, validated before anything starts.

An invalid file names the field and the problem (``ConfigError``) and the agent
exits non-zero: a typo found at start is cheaper than one found at 3 a.m. Its
``engines`` and ``install`` sections are ``agentd.engineconfig``'s.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentd import safeyaml
from agentd.engineconfig import EnginesConfig, InstallConfig
from agentd.ports import DEFAULT_PORT_RANGE, check_port_range
from agentd.protocol import NODE_ID_PATTERN

AGENT_PATH = "/ws/agent/"
DEFAULT_STATE_DIR = "/var/lib/llmgw-agent"


class ConfigError(ValueError):
    """agent.yaml is unreadable or invalid. The message names the field and the problem."""


def sanitise_node_id(name: str) -> str:
    """A hostname as a node id: safe characters only, starting with a letter or digit.

    Hostnames are usually fine already; this covers the odd underscore-free
    Windows-style or over-long name so the default never fails validation.
    """
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", name.strip())
    text = text.lstrip("._-")[:63] or "node"
    if not re.match(NODE_ID_PATTERN, text):  # pragma: no cover - the steps above guarantee it
        raise ConfigError(f"node_id: cannot make a node id from hostname {name!r}")
    return text


class GPUChecks(BaseModel):
    """When a GPU counts as having a problem, which keeps it out of placement."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Volatile uncorrected ECC errors above this are a problem. 0: any is one.
    ecc_error_threshold: Annotated[int, Field(ge=0)] = 0
    # Hotter than this is a problem. The driver's own slowdown threshold, when it
    # reports one, also counts: a GPU being clocked down is a GPU to avoid.
    max_temperature_c: Annotated[int, Field(gt=0, le=150)] = 87


class FetchConfig(BaseModel):
    """How the agent fetches weights named by URL or hub repository (docs/weights.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Fetches that move at once on this node; more wait their turn.
    max_concurrent: Annotated[int, Field(ge=1, le=64)] = 2
    # A download that receives nothing for this long fails (and is resumed on the retry).
    stall_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    # CA bundle (PEM) for https:// sources and the hub, e.g. a mirror with a private CA.
    # Default: the system's.
    ca_file: Path | None = None
    # The Hugging Face hub, or a mirror of it, for hf:// sources.
    hf_endpoint: str = "https://huggingface.co"
    # A token for gated or private repositories. Empty: HF_TOKEN or none.
    hf_token: str = ""
    # https:// and http:// sources (weights and adapters) are refused when the
    # address connected to is loopback, link-local, private, unspecified, multicast
    # or reserved, redirects included: a URL in a profile must not make the node
    # reach its own network. True allows every address; allow_networks allows
    # these networks (CIDRs) only. hf_endpoint is this file's own and not checked.
    allow_private_addresses: bool = False
    allow_networks: list[str] = []

    @field_validator("hf_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"must be an http(s):// URL of a hub or mirror (got {value!r})")
        return value.rstrip("/")

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for text in value:
            try:
                ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValueError(
                    f"{text!r} is not a network: an address or a CIDR (10.0.0.0/8, fd00::/8)"
                ) from None
        return value

    @field_validator("ca_file")
    @classmethod
    def _ca(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a file")
        return value


class NoticeConfig(BaseModel):
    """Where this node hears it is going away (agentd/notice.py, docs/agent.md "Notices")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # aws, gcp, azure (the cloud's metadata service) or file; empty: none.
    source: str = ""
    # The metadata service's base URL (http://host[:port]) instead of the cloud's
    # own: a proxy, or a stand-in in tests. The paths asked are the cloud's.
    url: str = ""
    # For source file: the file whose content (seconds, or {"in_s": N, "reason": ...})
    # counted from its modification time is the deadline.
    file: Path | None = None
    # How often the source is asked (AWS recommends every 5 s).
    poll_interval_s: Annotated[float, Field(gt=0, le=300)] = 5.0
    # How long one request to the metadata service may take.
    timeout_s: Annotated[float, Field(gt=0, le=30)] = 2.0

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        from agentd.notice import NAMES

        if value and value not in NAMES:
            raise ValueError(f"unknown source {value!r} (known: {', '.join(NAMES)})")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if value and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ValueError(f"must be an http(s):// URL of a metadata service (got {value!r})")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _file(self) -> NoticeConfig:
        if self.source == "file" and self.file is None:
            raise ValueError("file: source file needs the file to watch")
        if self.file is not None and self.source != "file":
            raise ValueError("file: only means something with source file")
        if self.url and self.source in ("", "file"):
            raise ValueError("url: only means something with source aws, gcp or azure")
        return self


def check_control_plane_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"must start with ws:// or wss:// (got {value!r})")
    if not parts.hostname:
        raise ValueError(f"names no host (got {value!r})")
    if parts.path != AGENT_PATH:
        raise ValueError(f"the path must be {AGENT_PATH} (got {parts.path or '/'!r})")
    return value


class Config(BaseModel):
    """A validated agent.yaml. See docs/agent.example.yaml for every field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    control_plane_url: str
    # More web processes of the same control plane, tried in turn after it when a
    # connection fails or ends (behind no load balancer, or as its fallback).
    control_plane_urls: list[str] = []
    join_token: str | None = None
    credential_file: Path | None = None  # default: <state_dir>/credential
    node_id: str = Field(default_factory=lambda: sanitise_node_id(socket.gethostname()))
    labels: dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=255)]] = {}
    mgmt_addr: str = ""  # default: the address the socket to the control plane leaves from
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    log_file: Path | None = None  # default: <state_dir>/agent.log
    weights_dirs: list[Path] = []
    # Directories holding weights that local model_path and adapter sources may
    # name, beyond weights_dirs: a local path outside both is refused (agentd.localpaths).
    model_dirs: list[Path] = []
    engines: EnginesConfig = EnginesConfig()
    install: InstallConfig = InstallConfig()
    fetch: FetchConfig = FetchConfig()
    engine_port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    heartbeat_interval_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    tls_ca_file: Path | None = None
    # A client certificate (PEM, its chain after it) and its private key, presented
    # to a TLS proxy that checks nodes' certificates (docs/security.md). The key may
    # sit in the certificate's file; then leave tls_key_file out.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # InfiniBand ports are grouped into fabrics by subnet prefix; this names the
    # fabric instead, for sites whose subnet managers all use the default prefix.
    fabric_name: str = ""
    gpu_checks: GPUChecks = GPUChecks()
    notice: NoticeConfig = NoticeConfig()

    @field_validator("control_plane_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_control_plane_url(value)

    @field_validator("control_plane_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for i, url in enumerate(value):
            try:
                check_control_plane_url(url)
            except ValueError as exc:
                raise ValueError(f"[{i}]: {exc}") from None
        return value

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, value: str) -> str:
        if not re.match(NODE_ID_PATTERN, value):
            raise ValueError(
                f"{value!r} is not a node id: letters, digits, '.', '_' and '-', "
                "starting with a letter or digit, at most 63 characters"
            )
        return value

    @field_validator("join_token")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("is empty; leave it out once the node has a credential")
        return value.strip() if value else value

    @field_validator("model_dirs")
    @classmethod
    def _absolute(cls, value: list[Path]) -> list[Path]:
        for path in value:
            if not path.is_absolute():
                raise ValueError(f"{str(path)!r} is not an absolute path")
        return value

    @field_validator("engine_port_range")
    @classmethod
    def _ports(cls, value: tuple[int, int]) -> tuple[int, int]:
        return check_port_range(*value)

    @model_validator(mode="after")
    def _tls(self) -> Config:
        schemes = {url.split("://", 1)[0] for url in self.urls}
        if len(schemes) > 1:
            raise ValueError(
                "control_plane_urls: every URL must use the scheme of control_plane_url "
                f"({self.control_plane_url.split('://', 1)[0]}://): one TLS setting serves all"
            )
        if len(set(self.urls)) < len(self.urls):
            raise ValueError("control_plane_urls: names a URL twice")
        plain = not self.control_plane_url.startswith("wss://")
        for name in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
            if getattr(self, name) is not None and plain:
                raise ValueError(f"{name}: only means something with a wss:// control_plane_url")
        if self.tls_key_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_key_file: names the key of tls_cert_file, which is not set")
        return self

    # ---- derived paths -----------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Every URL of the control plane, in the order they are tried."""
        return [self.control_plane_url, *self.control_plane_urls]

    @property
    def credential_path(self) -> Path:
        return self.credential_file or self.state_dir / "credential"

    @property
    def envs_dir(self) -> Path:
        """Where the engines the agent installs live, one virtualenv each."""
        return Path(self.install.root) if self.install.root else self.state_dir / "engines"

    @property
    def log_path(self) -> Path:
        return self.log_file or self.state_dir / "agent.log"

    @property
    def local_roots(self) -> list[Path]:
        """Where a local model_path or adapter source may point: weights_dirs, model_dirs."""
        return [*self.weights_dirs, *self.model_dirs]

    @property
    def private_paths(self) -> list[Path]:
        """The agent's own files, never handed to an engine (agentd.localpaths)."""
        own = [self.state_dir, self.credential_path, self.tls_key_file, self.tls_cert_file]
        return [p for p in own if p is not None]

    def read_credential(self) -> str | None:
        """The node credential written after enrolment, if there is one."""
        try:
            text = self.credential_path.read_text().strip()
        except FileNotFoundError:
            return None
        return text or None

    def bearer(self) -> str:
        """The secret to present: the node's own credential once it has one, else the token."""
        secret = self.read_credential() or self.join_token
        if not secret:
            raise ConfigError(
                f"join_token: needed until the node has a credential "
                f"({self.credential_path} does not exist yet)"
            )
        return secret


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "agent.yaml"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (a typo?)"
        lines.append(f"{where}: {msg}")
    return "; ".join(lines)


def parse_config(data: object, *, source: str = "agent.yaml") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: must be a mapping of field: value")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None


def load_config(path: str | Path) -> Config:
    """Read and validate agent.yaml, or raise ConfigError saying what is wrong."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = safeyaml.load(text)  # no anchors or aliases; at most 1 MiB
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, source=str(path))
