"""The console's pages: cluster, node, model, batches, costs, and the fragments that refresh
them in place.

Each is a page or a fragment (``pages``: who may see it) and needs the model's
view permission, as the admin's lists and the API do. Actions are POSTs with
Django's CSRF check, behind a confirmation page, calling the same services as
the admin's actions with the same permissions (a node's: ``node_actions``).
Batches are shown by their owners' teams on top of the permission
(``services.batches.owners.seen_by``): another team's batch is absent from the
list and its page a 404. Costs likewise
(``services.cost_scope``): a member sees their teams' costs and totals of those.
"""

import time
from urllib.parse import urlencode

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from fleet.models import Batch, Model, Node, Replica
from fleet.services import charts, console, node_logs, permissions
from fleet.services import drain as drain_service
from fleet.services import nodes as node_service
from fleet.services.console import costs as console_costs

from . import node_actions, svg
from .pages import BATCHES, COSTS, MODELS, NODES, WEIGHTS, admin_context, fragment, page

REFRESH_S = 5  # the cluster page, a node's current figures, batches' progress
CHARTS_REFRESH_S = 30
LOG_LINES = (50, 200, 1000)


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
        admin_context(
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


@page(NODES)
@require_GET
def node(request, node_id: str):
    detail = _detail(request, node_id)
    return render(
        request,
        "console/node.html",
        admin_context(
            request,
            f"Node {node_id}",
            d=detail,
            refresh_s=REFRESH_S,
            charts_refresh_s=CHARTS_REFRESH_S,
            log_lines=LOG_LINES,
            actions=node_actions.allowed(request.user),
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


def _chartscontext(node_id: str) -> dict:
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
        context = _chartscontext(node_id)
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
        admin_context(
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
        admin_context(
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
        admin_context(
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
        admin_context(request, f"Batch {batch_id}", d=detail, refresh_s=REFRESH_S),
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
        admin_context(
            request,
            "Costs",
            c=data,
            error=error,
            periods=console_costs.PERIODS,
            charts=[(ch, svg.stacked_bars(ch, _team_label)) for ch in data.charts],
            csv_url=reverse("cost-list") + "?" + urlencode({**csv_query, "format": "csv"}),
        ),
    )
