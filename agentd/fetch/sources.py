"""Where a profile's weights come from: a local path, a URL of one file, or a hub repository.

``parse`` reads a profile's ``model_path``. Anything without ``://`` is a local
path (or a hub id the engine resolves itself, as before) and is left to the
engine. ``https://host/path/file`` (and ``http://``, for a mirror on a trusted
network) names one file; ``hf://org/name[@revision]`` a Hugging Face repository,
and ``hf://org/name/path/in/repo[@revision]`` one file or folder of it (the
revision goes last, so a branch with a '/' in its name stays a revision).
The control plane validates profiles with the same function, so a profile that
saves is one every agent can fetch.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

URL = "url"
HUB = "hf"
DEFAULT_REVISION = "main"

# The hub's own rules for a repository id: letters, digits, '-', '_', '.',
# no '--' or '..', not starting or ending with '-' or '.', at most 96 characters.
_REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,255}$")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
# The parts of a split GGUF: name-00001-of-00003.gguf and its siblings.
SPLIT_GGUF = re.compile(r"^(?P<stem>.+)-(?P<n>\d{5})-of-(?P<of>\d{5})\.gguf$")
# A revision ending in one of these is a file named after the revision by mistake.
_WEIGHTS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".json")
HUB_FORM = "hf://org/name[/path/in/repo][@revision]"
FORMS = f"a local path, https://host/path/file, http://host/path/file or {HUB_FORM}"


class SourceError(ValueError):
    """A model_path that looks like a source but is not a valid one; the message says why."""


@dataclass(frozen=True)
class Source:
    """A remote source of weights; ``text`` is the model_path exactly as the profile has it."""

    text: str
    kind: str  # URL or HUB
    url: str = ""
    repo: str = ""
    revision: str = ""
    path: str = ""  # a hub source's file or folder in the repository; "" for all of it

    @property
    def file_name(self) -> str:
        """A URL's last path part: the name the fetched file keeps (engines look at suffixes)."""
        return unquote(urlsplit(self.url).path.rsplit("/", 1)[-1]) if self.kind == URL else ""

    def split_parts(self) -> set[str]:
        """The other parts of a split GGUF a hub path names by its first part
        (``x-00001-of-00003.gguf``): fetched with it. Empty otherwise."""
        part = SPLIT_GGUF.match(self.path) if self.kind == HUB else None
        if part is None or int(part["n"]) != 1:
            return set()
        stem, of = part["stem"], part["of"]
        return {f"{stem}-{i:05d}-of-{of}.gguf" for i in range(2, int(of) + 1)}

    def holds(self, name: str) -> bool:
        """Whether the file ``name`` (a URL's file name, a path in a hub repository)
        is among what this source fetches."""
        if self.kind == URL:
            return name == self.file_name
        path = self.path
        if not path or name == path or name.startswith(path + "/"):
            return True
        return name in self.split_parts()

    @property
    def slug(self) -> str:
        """The entry's directory name under a weights dir: readable, and unique per source.

        The same source gets the same name on every node, so an entry on a shared
        filesystem is found by every node that mounts it.
        """
        digest = hashlib.sha256(self.text.encode()).hexdigest()[:12]
        if self.kind == HUB:
            org, name = self.repo.split("/", 1)
            inside = f"{self.path.replace('/', '--')}--" if self.path else ""
            readable = f"hf--{org}--{name}--{inside}{self.revision}"
        else:
            parts = urlsplit(self.url)
            readable = f"{parts.hostname}--{parts.path.strip('/')}"
        return f"{_SAFE.sub('-', readable)[:96].strip('-.')}-{digest}"


def is_remote(model_path: str) -> bool:
    return "://" in model_path


def parse(model_path: str) -> Source | None:
    """The remote source a model_path names; None for a local path. SourceError if malformed."""
    text = model_path
    if not is_remote(text):
        return None
    if text != text.strip() or any(c.isspace() for c in text):
        raise SourceError(f"{text!r} contains white space")
    scheme = text.split("://", 1)[0]
    if scheme in ("https", "http"):
        return _url(text)
    if scheme == "hf":
        return _hub(text)
    raise SourceError(f"unknown scheme '{scheme}://' in {text!r}; use {FORMS}")


def _url(text: str) -> Source:
    try:
        parts = urlsplit(text)
        port = parts.port  # raises for a port that is not a number
    except ValueError as exc:
        raise SourceError(f"{text!r} is not a valid URL: {exc}") from None
    if not parts.hostname:
        raise SourceError(f"{text!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise SourceError(
            f"{text!r} carries credentials; model_path is shown to every operator, "
            "so give the node access another way (a mirror it may read)"
        )
    if port == 0:
        raise SourceError(f"{text!r}: port 0 is not a port")
    if parts.fragment:
        raise SourceError(f"{text!r} has a fragment ('#…'), which a server never sees")
    name = unquote(parts.path.rsplit("/", 1)[-1])
    if not name or name in (".", ".."):
        raise SourceError(f"{text!r} names no file: its path must end in a file name")
    if "/" in name or "\x00" in name:
        raise SourceError(f"{text!r}: the file name {name!r} is not a plain name")
    return Source(text=text, kind=URL, url=text)


def _hub(text: str) -> Source:
    rest = text[len("hf://") :]
    repo, at, revision = rest.partition("@")
    if at and not revision:
        raise SourceError(f"{text!r}: nothing after '@'; name a revision or leave '@' out")
    revision = revision or DEFAULT_REVISION
    pieces = repo.split("/")
    if len(pieces) < 2 or not all(pieces[:2]):
        raise SourceError(f"{text!r}: a hub source is {HUB_FORM}")
    pieces, inside = pieces[:2], pieces[2:]
    for part in inside:
        if part in ("", ".", "..") or "\\" in part or "\x00" in part:
            raise SourceError(
                f"{text!r}: {'/'.join(inside)!r} is not a path in the repository "
                "(no empty, '.' or '..' parts)"
            )
    repo = "/".join(pieces)
    for piece in pieces:
        if not _REPO_PART.match(piece) or "--" in piece or ".." in piece:
            raise SourceError(
                f"{text!r}: {piece!r} is not a valid hub name (letters, digits, '-', '_', '.'; "
                "no '--' or '..'; starting and ending with a letter or digit)"
            )
    if len(repo) > 96:
        raise SourceError(f"{text!r}: the repository id is longer than 96 characters")
    head, slash, tail = revision.partition("/")
    if slash and tail.lower().endswith(_WEIGHTS_SUFFIXES):
        raise SourceError(
            f"{text!r}: '@{revision}' reads as a revision; a file goes before it: "
            f"hf://{repo}/{tail}@{head}"
        )
    if not _REVISION.match(revision) or ".." in revision or revision.startswith("/"):
        raise SourceError(f"{text!r}: {revision!r} is not a valid revision")
    return Source(text=text, kind=HUB, repo=repo, revision=revision, path="/".join(inside))


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a file inside a fetched entry (a relative path with no empty,
    '.' or '..' part), or None. Both ends ask: the control plane before it saves a
    profile, the agent before it opens ``entry / name``, so an older control plane
    cannot make an agent read outside the entry."""
    if not isinstance(name, str) or not name or len(name) > 1024:
        return f"{name!r} is not a file name"
    if name.startswith("/") or "\\" in name or "\x00" in name:
        return f"{name!r} is not a file inside the fetched copy: name it by its relative path"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return (
            f"{name!r} is not a file inside the fetched copy: its path has an empty, "
            "'.' or '..' part"
        )
    return None


def check_sha256(value: object) -> list[str]:
    """Problems with a weights_sha256 mapping (file name -> 64 lowercase hex digits)."""
    if not isinstance(value, dict):
        return ['must map file names to sha256 hex digests, e.g. {"model.gguf": "ab12…"}']
    problems = []
    for name, digest in value.items():
        if (problem := name_problem(name)) is not None:
            problems.append(problem)
        elif not isinstance(digest, str) or not _SHA256.match(digest):
            problems.append(f"{name}: {digest!r} is not a sha256 (64 lowercase hex digits)")
    return problems
