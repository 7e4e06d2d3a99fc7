"""Wanted engines and each node's vLLM build: what agents are told to install (docs/engines.md).

The fleet's wanted engines are ``WantedEngine`` rows (admin, API, ``apply -f``);
with none, ``LLMGW_ENGINES`` is the list. Each node gets them in a ``provision``
message, vLLM's with the node's build as its variant, when it registers and at
once whenever either changes (``NODE_PROVISION`` doorbell). The agent decides the
rest (agentd/install.py), and reports each engine's install state back.
"""

from __future__ import annotations

from django.db import transaction

from agentd import protocol
from agentd.sources import describe
from fleet.conf import fleet_settings
from fleet.models import EngineInstall, Node, VllmBuild, WantedEngine
from fleet.services import doorbells, permissions
from fleet.services.permissions import SYSTEM


def wanted() -> dict[str, str]:
    """Engine -> version the fleet runs: the rows, else the LLMGW_ENGINES setting."""
    rows = dict(WantedEngine.objects.values_list("engine", "version"))
    return rows or dict(fleet_settings().engines)


def provision_for(
    node_id: str, engines: dict[str, str] | None = None, build: str | None = None
) -> protocol.Provision:
    """The provision message for one node; ``build``, its vLLM build, when the caller
    has just read or written the node's row (a registration), saves a query."""
    engines = wanted() if engines is None else engines
    if build is None:
        build = Node.objects.filter(pk=node_id).values_list("vllm_build", flat=True).first()
    return protocol.Provision(
        type="provision",
        engines=[
            protocol.EngineWant(
                engine=engine,
                version=version,
                variant=(build or VllmBuild.AUTO) if engine == "vllm" else "",
            )
            for engine, version in sorted(engines.items())
        ],
    )


def tell_nodes(node_ids=None) -> None:
    """Ring these nodes' sockets (all connected nodes by default) to send provision again,
    once the current transaction commits."""
    if node_ids is None:
        node_ids = Node.objects.filter(connected=True).values_list("pk", flat=True)
    for node_id in list(node_ids):
        doorbells.ring_node(node_id, doorbells.NODE_PROVISION)


class BadBuild(ValueError):
    pass


def check_build(build: str) -> str:
    if build not in VllmBuild.values:
        raise BadBuild(f"'{build}' is not a vLLM build (one of: {', '.join(VllmBuild.values)})")
    return build


def set_vllm_build(nodes, build: str, actor=SYSTEM) -> int:
    """Set the vLLM build of these nodes; each changed one is told at once. Returns how many
    changed. ``actor`` needs change_node (permissions.Refused otherwise)."""
    permissions.require_action(actor, "node.vllm_build", "choose a node's vLLM build")
    check_build(build)
    changed = []
    with transaction.atomic():
        for node in nodes:
            if node.vllm_build != build:
                node.vllm_build = build
                node.save(update_fields=["vllm_build"])
                changed.append(node.pk)
        tell_nodes(changed)
    return len(changed)


def install_text(install: EngineInstall) -> str:
    """One engine's install state as operators read it: "vllm 0.11.2 cu129 installed"."""
    return describe(
        install.engine,
        install.version,
        install.variant,
        install.state,
        install.detail,
        install.progress_percent,
    )


def installs_summary(installs) -> str:
    """A node's installs on one line, for ``manage.py nodes`` and lists."""
    return "; ".join(install_text(i) for i in installs) or "-"
