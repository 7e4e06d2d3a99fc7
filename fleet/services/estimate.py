"""What a model needs in GPU memory, from its weights' own metadata, before it is placed.

Weights are the tensors' sizes as their files declare them: a GGUF's tensor infos, a
safetensors file's header. The KV cache is 2 (K and V) x layers x KV heads x head
size x tokens x sequences x 2 bytes (f16), with the geometry from the GGUF's metadata
or the model's config.json. Only headers are read, local or remote (``https://``,
``hf://``, as ``agentd.fetch.sources`` parses them; Range requests), in prefixes
that double until the header parses (``weight_headers`` parses them). Anything
unknown raises EstimateError: an estimate without the KV cache would place a model
where it cannot run.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import urllib.error
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, urljoin

from agentd.fetch.http import AddressGuard, FetchError, describe_error, http_request, opener
from agentd.fetch.sources import HUB, SPLIT_GGUF, Source, SourceError, parse
from fleet.services import weight_headers
from fleet.services.units import MIB_PER_GIB, bytes_text
from fleet.services.weight_headers import MAX_HEADER

GIB = MIB_PER_GIB * 1024 * 1024
FIRST_READ = 1 << 20  # headers are read in doubling prefixes, up to MAX_HEADER
_BLOCK = re.compile(r"^((?:.*?\.)?(?:blk|layers|h)\.\d+)\.")  # blk.3. model.layers.3. h.3.


class EstimateError(Exception):
    """The weights or their geometry cannot be read; the message names the file and why."""


@dataclass(frozen=True)
class Estimate:
    """The memory a model needs on its GPUs for a context length and concurrent sequences."""

    weights_bytes: int
    kv_bytes: int
    context_tokens: int  # the context length used (given, or the model's own)
    sequences: int
    layers: int  # transformer blocks
    layer_bytes: int  # weights of the largest block (for llama.cpp layer offload)
    source: str  # where the numbers were read: "GGUF header of /srv/m.gguf"

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes

    def text(self) -> str:
        """For operators: "needs 17.3 GB: 14.2 weights + 3.1 KV cache for 8,192 tokens × 4
        sequences", in binary units (GB is GiB, as GPUs count), in bytes_text's under 1 GiB."""
        seqs = f"{self.context_tokens:,} tokens × {self.sequences:,} sequence"
        seqs += "" if self.sequences == 1 else "s"
        amounts = (self.total_bytes, self.weights_bytes, self.kv_bytes)
        if self.total_bytes < GIB:
            total, w, kv = map(bytes_text, amounts)
        else:
            total, w, kv = (f"{n / GIB:.1f}" for n in amounts)
            total += " GB"
        return f"needs {total}: {w} weights + {kv} KV cache for {seqs}"

    def as_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes, "text": self.text()}


@dataclass(frozen=True)
class _Geometry:
    layers: int
    kv_heads: int
    kv_width: int  # key size + value size of one KV head
    context: int | None


def estimate(
    model_path: str,
    *,
    context_tokens: int | None = None,
    sequences: int = 1,
    hf_endpoint: str | None = None,
    hf_token: str | None = None,
    timeout: float = 10.0,
    roots: list[str] | None = None,
    guard: AddressGuard | None = None,
) -> Estimate:
    """The memory ``model_path`` (any form a profile's model_path takes) needs. Blocking.

    ``roots``: where a local path may be read (None: anywhere, for a caller that
    trusts the path); ``guard``: which addresses an https:// source may be read from
    (None: any). What a profile names is read through both (``refresh_profiles``).
    """
    if sequences < 1 or (context_tokens is not None and context_tokens < 1):
        raise EstimateError(
            f"{model_path}: {context_tokens} tokens × {sequences} sequences is "
            "not a size: both are at least 1"
        )
    try:
        source = parse(model_path)
    except SourceError as exc:
        raise EstimateError(str(exc)) from None
    if source is None:
        if roots is not None:
            _check_root(model_path, roots)
        what, tensors, geometry = _local(Path(model_path))
    elif source.kind == HUB:
        what, tensors, geometry = _hub(source, hf_endpoint, hf_token, timeout)
    else:
        what, tensors, geometry = _url(source, timeout, guard)
    ctx = context_tokens or geometry.context
    if not ctx:
        raise EstimateError(f"{model_path} states no context length: give one")
    blocks: dict[str, int] = {}
    for name, size in tensors:
        if block := _BLOCK.match(name):
            blocks[block[1]] = blocks.get(block[1], 0) + size
    kv = geometry.layers * geometry.kv_heads * geometry.kv_width * ctx * sequences * 2
    weights, layer = sum(size for _, size in tensors), max(blocks.values(), default=0)
    return Estimate(weights, kv, ctx, sequences, geometry.layers, layer, what)


# ---- where the files are -------------------------------------------------------------


class _Files:
    """Weights files by name: in a local folder (no ``url_of``), over http(s) beside a URL,
    or in a hub repository at a revision."""

    def __init__(
        self, where_of, url_of=None, headers: dict | None = None, timeout: float = 0, guard=None
    ):
        self.where, self.url_of, self.headers, self.timeout = where_of, url_of, headers, timeout
        self.guard = guard

    def read(self, name: str, size: int = MAX_HEADER) -> bytes | None:
        """The first ``size`` bytes of a file; None when there is no such file."""
        where = self.where(name)
        try:
            if self.url_of is None:
                with open(where, "rb") as fh:
                    return fh.read(size)
            url = self.url_of(name)
            req = http_request(url, {**(self.headers or {}), "Range": f"bytes=0-{size - 1}"})
            with opener(guard=self.guard).open(req, timeout=self.timeout) as resp:
                return resp.read(size)
        except FileNotFoundError:
            return None
        except FetchError as exc:  # an address the guard refuses
            raise EstimateError(str(exc)) from None
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            problem = describe_error(url, exc, self.timeout)
        except OSError as exc:
            if self.url_of is None:
                raise EstimateError(f"{where}: {exc.strerror or exc}") from None
            problem = describe_error(url, exc, self.timeout)
        raise EstimateError(problem if where == url else f"{where}: {problem}")


def _local(path: Path):
    if not path.exists():
        raise EstimateError(f"{path}: no such file or directory")
    if path.is_file():
        return _weights(_Files(lambda n: str(path.parent / n)), [path.name], str(path), True)
    names = sorted(p.name for p in path.iterdir())
    return _folder(_Files(lambda n: str(path / n)), names, "", str(path))


def _check_root(model_path: str, roots: list[str]) -> None:
    """Refuse a local path outside ``roots`` before anything of it is looked at: the
    control plane reads no file a profile names but the weights it was told to."""
    real = Path(os.path.realpath(model_path))
    if any(real.is_relative_to(os.path.realpath(r)) for r in roots):
        return
    where = ", ".join(roots) if roots else "none are set"
    raise EstimateError(
        f"{model_path}: the control plane reads local weights only under "
        f"LLMGW_ESTIMATE_DIRS ({where}); the nodes read it as their agent.yaml allows"
    )


def _url(src: Source, timeout: float, guard=None):
    def url(name: str) -> str:  # the file, or one beside it: split parts, config.json
        return src.url if name == src.file_name else urljoin(src.url, quote(name))

    return _weights(_Files(url, url, {}, timeout, guard), [src.file_name], src.text, True)


def _hub(src: Source, endpoint: str | None, token: str | None, timeout: float):
    """An hf:// source: the files the agent would fetch (``agentd.fetch.hub``), at the
    commit the revision names now, with the hub's endpoint and token."""
    from huggingface_hub import constants, hf_hub_url

    from agentd.fetch import hub

    endpoint = endpoint or constants.ENDPOINT
    try:
        plan = hub.plan(src, endpoint=endpoint, token=token or "", timeout_s=timeout)
    except FetchError as exc:
        raise EstimateError(str(exc)) from None
    files = _Files(
        lambda name: f"hf://{src.repo}/{name}@{src.revision}",
        lambda name: hf_hub_url(src.repo, name, revision=plan.commit, endpoint=endpoint),
        plan.headers,
        timeout,
    )
    if src.path.endswith((".gguf", ".safetensors")):
        return _weights(files, [src.path], files.where(src.path), True)
    return _folder(files, [f.name for f in plan.files], src.path, src.text)


def _folder(files, names: list[str], folder: str, label: str):
    """A folder's or repository's weights: the safetensors files its index maps (it may hold
    a consolidated copy as well), else those in it, else its one GGUF (or first part)."""
    inside = folder + "/" if folder else ""
    if (index := inside + "model.safetensors.index.json") in names:
        try:
            mapped = json.loads(files.read(index) or b"")["weight_map"].values()
            chosen = sorted({inside + name for name in mapped})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EstimateError(f"{files.where(index)}: unreadable ({exc})") from None
    else:
        chosen = [n for n in names if n.endswith(".safetensors") and n.rpartition("/")[0] == folder]
    if not chosen:
        chosen = [n for n in names if n.startswith(inside) and _first_gguf(n)]
        if len(chosen) != 1:
            found = ", ".join(chosen) or "none"
            raise EstimateError(f"{label}: needs .safetensors or one .gguf file (found {found})")
        return _weights(files, chosen, files.where(chosen[0]), True)
    return _weights(files, chosen, label, False)


# ---- headers --------------------------------------------------------------------------


def _weights(files, names: list[str], label: str, one_file: bool):
    """Tensor sizes and geometry of one GGUF (with its split parts) or of safetensors files."""
    if len(names) == 1 and names[0].endswith(".gguf"):
        meta, tensors, parts = {}, [], _split_names(names[0], files.where(names[0]))
        for part in parts:
            part_meta, part_tensors = _header(files, part, weight_headers.gguf, "GGUF")
            meta, tensors = meta or part_meta, tensors + part_tensors  # the first part's metadata
        what = f"GGUF header of {label}" if len(parts) == 1 else f"GGUF headers of {label}"
        return what, tensors, _gguf_geometry(meta, files.where(names[0]))
    if not all(name.endswith(".safetensors") for name in names):
        raise EstimateError(f"{files.where(names[0])}: not a .gguf or .safetensors file")
    header = weight_headers.safetensors
    tensors = [t for name in names for t in _header(files, name, header, "safetensors")]
    config = posixpath.join(posixpath.dirname(names[0]), "config.json")
    what = f"safetensors header{'' if len(names) == 1 else 's'} of {label}"
    return what, tensors, _config(files, config, label, one_file)


def _header(files, name: str, parser, kind: str):
    size, where = FIRST_READ, files.where(name)
    while True:
        buf = files.read(name, size)
        if buf is None:
            answer = " (the server answered 404)" if files.url_of else ""
            raise EstimateError(f"{where}: no such file{answer}")
        try:
            return parser(buf)
        except weight_headers.Short:
            if len(buf) < size:
                raise EstimateError(f"{where}: the file ends inside its header") from None
            if size >= MAX_HEADER:
                raise EstimateError(f"{where}: its header is over {MAX_HEADER >> 20} MiB") from None
            size *= 2
        except weight_headers.Unknown as exc:
            raise EstimateError(f"{where}: {exc}") from None
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise EstimateError(f"{where}: not a {kind} file ({exc})") from None


def _config(files, name: str, label: str, one_file: bool) -> _Geometry:
    raw = files.read(name)
    if raw is None:
        beside = " beside it" if one_file else ""
        raise EstimateError(f"{label} has no config.json{beside}: the KV cache cannot be estimated")
    try:
        return _config_geometry(json.loads(raw), files.where(name))
    except (ValueError, AttributeError) as exc:
        raise EstimateError(f"{files.where(name)}: unreadable ({exc})") from None


def _config_geometry(config: dict, where: str) -> _Geometry:
    if "num_hidden_layers" not in config and "n_layer" not in config:
        config = config.get("text_config") or config  # multimodal models nest the LM's

    def get(*keys: str) -> int | None:
        return next((config[key] for key in keys if _count(config.get(key))), None)

    def need(*keys: str) -> int:
        if (value := get(*keys)) is None:
            raise EstimateError(f"{where} has no {keys[0]}: the KV cache cannot be estimated")
        return value

    heads = need("num_attention_heads", "n_head")
    head_dim = get("head_dim") or need("hidden_size", "n_embd") // heads
    kv_heads = get("num_key_value_heads") or heads
    ctx = get("max_position_embeddings", "n_positions")
    return _Geometry(need("num_hidden_layers", "n_layer"), kv_heads, 2 * head_dim, ctx)


def _gguf_geometry(meta: dict, where: str) -> _Geometry:
    arch = meta.get("general.architecture")
    if not arch:
        raise EstimateError(f"{where} has no general.architecture")

    def need(key: str, default=None) -> int:
        value = meta.get(f"{arch}.{key}", default)
        value = max(value, default=None) if isinstance(value, list) else value  # per layer
        if not _count(value):
            raise EstimateError(f"{where} has no {arch}.{key}: the KV cache cannot be estimated")
        return value

    heads = need("attention.head_count")
    head_dim = need("embedding_length") // heads
    width = need("attention.key_length", head_dim) + need("attention.value_length", head_dim)
    ctx = meta.get(f"{arch}.context_length")
    kv_heads = need("attention.head_count_kv", heads)
    return _Geometry(need("block_count"), kv_heads, width, ctx if _count(ctx) else None)


def _count(value) -> bool:
    """A positive whole number, as every size in a model's geometry is."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _split_names(name: str, where: str) -> list[str]:
    """A GGUF's file names: itself, or every part of a split one named by its first part."""
    part = SPLIT_GGUF.match(posixpath.basename(name))
    if part is None:
        return [name]
    if int(part["n"]) != 1:
        raise EstimateError(f"{where} is part {int(part['n'])} of a split GGUF; name its first")
    folder = posixpath.dirname(name)
    return [
        posixpath.join(folder, f"{part['stem']}-{i:05d}-of-{part['of']}.gguf")
        for i in range(1, int(part["of"]) + 1)
    ]


def _first_gguf(name: str) -> bool:
    """A GGUF file that is whole or the first part of a split one."""
    part = SPLIT_GGUF.match(posixpath.basename(name))
    return name.endswith(".gguf") and (part is None or int(part["n"]) == 1)


def estimate_key(profile) -> str:
    """What a profile's estimate was made from; a change of any of it makes a new one."""
    return json.dumps([profile.model_path, profile.context_tokens, profile.sequences])


def refresh_profiles(limit: int = 20) -> int:
    """Estimate the profiles whose estimate is missing or was made from other inputs.

    Reads weights' headers over the network, so beat runs it in the worker
    (``fleet.tasks.estimate_profiles``), never a request or the reconciler. A
    profile whose weights cannot be read gets the reason, shown where the estimate
    would be. Returns how many were estimated.
    """
    from fleet.conf import fleet_settings, networks
    from fleet.models import EngineProfile

    c = fleet_settings()
    roots = [d.strip() for d in c.estimate_dirs.split(",") if d.strip()]
    guard = AddressGuard(allow_networks=tuple(networks(c.estimate_allow_networks)))
    done = 0
    for profile in EngineProfile.objects.only(
        "model_path", "context_tokens", "sequences", "env", "estimate"
    ).iterator():
        key = estimate_key(profile)
        if profile.estimate.get("key") == key:
            continue
        try:
            found = estimate(
                profile.model_path,
                context_tokens=profile.context_tokens,
                sequences=profile.sequences,
                hf_endpoint=profile.env.get("HF_ENDPOINT"),
                hf_token=profile.env.get("HF_TOKEN"),
                roots=roots,
                guard=guard,
            )
        except EstimateError as exc:
            value = {"key": key, "error": str(exc)}
        else:
            value = {"key": key, **found.as_dict()}
        # Only if its inputs did not change meanwhile: the next run estimates those.
        EngineProfile.objects.filter(
            pk=profile.pk,
            model_path=profile.model_path,
            context_tokens=profile.context_tokens,
            sequences=profile.sequences,
        ).update(estimate=value)
        done += 1
        if done >= limit:
            break
    return done


def needed_text(estimate_value: dict) -> str:
    """The stored estimate for people: its text, why there is none, or "" before the first."""
    if estimate_value.get("text"):
        return estimate_value["text"]
    if estimate_value.get("error"):
        return f"no estimate: {estimate_value['error']}"
    return ""


def profile_text(profile) -> str:
    """A profile's estimate as explain, the admin and the console say it."""
    found = profile.estimate or {}
    if found.get("key") != estimate_key(profile):
        return "memory not estimated yet"
    return needed_text(found)
