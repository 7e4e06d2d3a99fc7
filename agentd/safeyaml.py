"""YAML from a file or a peer, loaded with bounded work.

PyYAML's ``safe_load`` builds no objects of its own choosing, but it still expands
aliases: 572 bytes of nested ``&a [*b, *b, …]`` grow to billions of nodes once
anything walks them (a view-only user stalled the web process this way). So an
anchor or an alias is refused outright — none of our files needs one — and so is
text past a size bound, nesting past a depth bound or more values than a count
bound, each with a message that names the problem. The check reads the event
stream (libyaml's, where PyYAML has it), so a refusal costs at most one pass
and builds nothing; a file within the bounds costs two passes, well under a
second.

The errors are ``yaml.MarkedYAMLError``s, so a caller that already reports
``yaml.YAMLError`` (with its line and column) reports these too. Standard library
and PyYAML only: ``fleet`` uses it for catalog files, the agent for agent.yaml,
``llmgw`` for its cli.yaml.
"""

from __future__ import annotations

import yaml

# 1 MiB of text: a catalog for hundreds of models is a few hundred KiB. The API's
# catalog field has the same bound.
MAX_CHARS = 1 << 20
# Our files nest five or six deep; a thousand brackets is an attack on the
# composer's recursion, not a file.
MAX_DEPTH = 64
# Values (scalars, lists, mappings) in one document: a catalog of a thousand
# models is about 30,000. It bounds the work on 1 MiB of "[1,1,1,…]" too.
MAX_NODES = 100_000

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UnsafeYAML(yaml.MarkedYAMLError):
    """Valid YAML we do not load: an anchor or alias, too large, or too deep."""


def load(text: str, *, max_chars: int = MAX_CHARS):
    """The one document in ``text``, as ``yaml.safe_load`` gives it; UnsafeYAML for an
    anchor, an alias, more than ``max_chars`` characters or more than MAX_DEPTH levels;
    another ``yaml.YAMLError`` for text that is not YAML."""
    if len(text) > max_chars:
        raise UnsafeYAML(problem=f"{len(text):,} characters is more than the {max_chars:,} allowed")
    try:
        _check_events(text, _Loader)
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader, checked above
    except UnsafeYAML:
        raise
    except yaml.YAMLError:
        if _Loader is yaml.SafeLoader:
            raise
    # libyaml words its errors differently from PyYAML's own parser (and some
    # machines have no libyaml): say what is wrong the same way everywhere. Only
    # text that is not YAML pays for the slower parser.
    _check_events(text, yaml.SafeLoader)
    return yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506 - safe, and checked


def _check_events(text: str, loader) -> None:
    depth = nodes = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.NodeEvent):
            nodes += 1
            if nodes > MAX_NODES:
                raise UnsafeYAML(
                    problem=f"more than {MAX_NODES:,} values in one file",
                    problem_mark=event.start_mark,
                )
        if isinstance(event, yaml.AliasEvent):
            raise UnsafeYAML(
                problem=f"anchors and aliases are not allowed (*{event.anchor}); "
                "write the value out",
                problem_mark=event.start_mark,
            )
        if getattr(event, "anchor", None) is not None:
            raise UnsafeYAML(
                problem=f"anchors and aliases are not allowed (&{event.anchor}); "
                "write the value out",
                problem_mark=event.start_mark,
            )
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise UnsafeYAML(
                    problem=f"nested more than {MAX_DEPTH} levels deep",
                    problem_mark=event.start_mark,
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
