"""A Hugging Face repository as a list of files to fetch, read with ``huggingface_hub``.

``huggingface_hub`` answers what the repository holds at a revision (the
commit, each file's size and checksums: the LFS sha256, or the git object id
for small files) and how to reach each file (the endpoint, the token, the
headers the hub expects). The bytes themselves go through ``agentd.fetch.http``
like a URL's: huggingface_hub 2.x deletes a partial file when its process
ends, and an agent killed mid-download must continue where it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentd.fetch.http import FetchError
from agentd.fetch.sources import SPLIT_GGUF, Source, name_problem


@dataclass(frozen=True)
class HubFile:
    name: str  # the path in the repository
    url: str
    size: int | None
    sha256: str | None  # LFS files
    git_sha1: str | None  # every file: the git object id of its content


@dataclass(frozen=True)
class HubPlan:
    commit: str
    files: list[HubFile]
    headers: dict[str, str]

    @property
    def total(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(sizes)  # type: ignore[arg-type]


def plan(source: Source, *, endpoint: str, token: str, timeout_s: float) -> HubPlan:
    """What to fetch for an hf:// source (blocking: call it in a thread). FetchError if not."""
    try:
        from huggingface_hub import HfApi, hf_hub_url
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
        from huggingface_hub.utils import build_hf_headers
    except ImportError:
        raise FetchError(
            f"{source.text}: huggingface_hub is not installed for this agent "
            "(pip install -r agentd/requirements.txt)"
        ) from None
    where = f"{source.text} (hub {endpoint})"
    api = HfApi(endpoint=endpoint, token=token or None)
    try:
        info = api.model_info(
            source.repo, revision=source.revision, files_metadata=True, timeout=timeout_s
        )
    except GatedRepoError:
        raise FetchError(
            f"{where}: the repository is gated; give the node a token that may read it "
            "(fetch.hf_token)"
        ) from None
    except RepositoryNotFoundError:
        raise FetchError(f"{where}: no such repository, or the token may not read it") from None
    except RevisionNotFoundError:
        raise FetchError(f"{where}: no revision {source.revision!r}") from None
    except HfHubHTTPError as exc:
        raise FetchError(f"{where}: {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # noqa: BLE001 - connection errors come from the HTTP library
        raise FetchError(f"{where}: cannot reach the hub: {exc}") from None
    if not info.sha or info.siblings is None:
        raise FetchError(f"{where}: the hub's answer names no commit or no files")
    siblings = chosen(source, info.siblings, where)
    files = [
        HubFile(
            name=s.rfilename,
            url=hf_hub_url(source.repo, s.rfilename, revision=info.sha, endpoint=endpoint),
            size=s.size,
            sha256=s.lfs.sha256 if s.lfs else None,
            git_sha1=s.blob_id,
        )
        for s in siblings
    ]
    for f in files:
        if (problem := name_problem(f.name)) is not None:
            raise FetchError(f"{where}: refusing the hub's file name: {problem}")
    headers = build_hf_headers(token=token or None)
    return HubPlan(commit=info.sha, files=files, headers=dict(headers))


def chosen(source: Source, siblings: list, where: str) -> list:
    """The repository's files a source asks for: all of them, or its file or folder.

    A file that is the first part of a split GGUF brings its other parts, which
    llama.cpp loads from beside it. FetchError if the path names nothing.
    """
    path = source.path
    if not path:
        return list(siblings)
    picked = [s for s in siblings if s.rfilename == path or s.rfilename.startswith(path + "/")]
    if not picked:
        names = sorted(s.rfilename for s in siblings)
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        raise FetchError(
            f"{where}: no file or folder {path!r} in the repository at {source.revision} "
            f"(it has: {shown or 'nothing'})"
        )
    part = SPLIT_GGUF.match(path)
    if part and int(part["n"]) != 1:
        raise FetchError(
            f"{where}: {path!r} is part {int(part['n'])} of a split GGUF; name its first "
            f"part, {part['stem']}-00001-of-{part['of']}.gguf, which brings the others"
        )
    parts = source.split_parts()
    return picked + [s for s in siblings if s.rfilename in parts]
