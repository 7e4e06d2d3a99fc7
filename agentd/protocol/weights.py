"""Weights on the wire: what a node holds, a fetch's progress, and removing what is unused.

This module changes when what is said about model weights changes
(docs/weights.md): the list a node reports, a fetch under way, and the control
plane's proposal to remove some (each path checked again by the node, which
says what it removed and what it kept).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from agentd.protocol.fields import Count, Msg, Part, ShardId, ShortStr, Text, Version


class KeptWeights(Part):
    """A path the agent kept although the control plane proposed removing it."""

    path: Annotated[str, Field(max_length=1024)]
    reason: Text


class Weights(Part):
    path: Annotated[str, Field(min_length=1, max_length=1024)]
    size_bytes: Count
    shared: bool = False
    # Where the agent fetched it from, exactly as the profile's model_path names
    # it (an https:// URL or hf://org/name[/path][@revision]); "" for weights that were
    # already there. Only complete, verified fetches are reported.
    source: Annotated[str, Field(max_length=1024)] = ""
    # When an engine last used it (unix seconds, the agent's clock). None: never
    # seen in use by this agent.
    last_used: Annotated[float, Field(ge=0)] | None = None


class FetchProgress(Msg):
    """Progress of a weight fetch. Not a state transition: it must not reset start timers."""

    type: Literal["fetch_progress"]
    shard_id: ShardId
    replica_id: ShortStr = ""
    source: Annotated[str, Field(max_length=1024)] = ""
    bytes_done: Count
    bytes_total: Count | None = None


class RemoveWeights(Msg):
    """A proposal: the node checks each path again before removing it.

    ``desired_version`` is the node's desired-set version the proposal was made
    against: an agent that has not applied that version yet keeps everything,
    and a path a desired shard (started or not) needs is always kept.
    """

    type: Literal["remove_weights"]
    paths: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=1024)]
    desired_version: Version = 0
    # Echoed in the agent's ack, so the control plane can match the reply.
    request_id: Annotated[str, Field(max_length=64)] = ""
