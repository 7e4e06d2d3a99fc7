"""Which weights entry serves which profile: one rule for placement and the clean-up.

A profile's ``model_path`` names its weights as a path (absolute, or the tail
of one: "org/name" finds /var/lib/llmgw/weights/org/name), a Hugging Face id
("org/name", also found as the hub cache's models--org--name directory), or a
source the agent fetches (https://…, hf://…), whose entry carries that source.
"""

from __future__ import annotations

HF_CACHE_PREFIX = "models--"
FETCHED_SCHEMES = ("https://", "hf://")


def is_fetched(model_path: str) -> bool:
    """Whether the agent fetches these weights (a URL or a hub id), rather than finding them."""
    return model_path.startswith(FETCHED_SCHEMES)


def names(path: str) -> set[str]:
    """Every name a model_path could use for the entry at ``path``, stripped of slashes."""
    parts = path.strip("/").split("/")
    keys = {"/".join(parts[i:]) for i in range(len(parts))}
    if parts[-1].startswith(HF_CACHE_PREFIX):
        keys.add(parts[-1][len(HF_CACHE_PREFIX) :].replace("--", "/"))
    return keys


class Wanted:
    """The model paths some shards need, ready for many cheap ``serves`` questions."""

    __slots__ = ("exact", "tails")

    def __init__(self, model_paths=()):
        self.exact: set[str] = set()  # as written: a fetched entry's source matches these
        # Last component -> (stripped model path, "/" + it), for endswith without a concat.
        self.tails: dict[str, set[tuple[str, str]]] = {}
        for p in model_paths:
            self.add(p)

    def add(self, model_path: str) -> None:
        if not model_path:
            return
        self.exact.add(model_path)
        stripped = model_path.strip("/")
        if stripped:
            self.tails.setdefault(stripped.rsplit("/", 1)[-1], set()).add(
                (stripped, "/" + stripped)
            )

    def __bool__(self) -> bool:
        return bool(self.exact)

    def serves(self, path: str, source: str = "") -> bool:
        """Whether the entry at ``path`` (fetched from ``source``) is one of these weights.

        The same answer as ``bool(names(path) & {stripped model paths})`` or an equal
        source, without building every name (tests/reconciler/test_weights_rules.py
        holds the two to each other).
        """
        if source and source in self.exact:
            return True
        if path.endswith("/"):
            path = path.rstrip("/")
        last = path[path.rfind("/") + 1 :]
        wants = self.tails.get(last)
        if wants is not None:
            for want, slashed in wants:
                if path.endswith(slashed) or path == want:
                    return True
        if last.startswith(HF_CACHE_PREFIX):
            hub = last[len(HF_CACHE_PREFIX) :].replace("--", "/")
            for want, _ in self.tails.get(hub.rsplit("/", 1)[-1], ()):
                if want == hub:
                    return True
        return False
