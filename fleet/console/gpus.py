"""Clearing a GPU's fault from its node's page: a confirmation that asks the reason, then
``fleet.services.gpu_health.clear``, which checks ``gpu.clear`` and keeps the audit entry
(docs/operations.md, "GPU faults and notices")."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from fleet.models import GPU
from fleet.services import gpu_health, permissions

from .pages import NODES, admin_context, page

REASON_MAX = 255


def may_clear(user) -> bool:
    return permissions.allowed(user, "gpu.clear")


@page(NODES)
@require_http_methods(["GET", "POST"])
def gpu_clear(request, node_id: str, index: int):
    gpu = GPU.objects.filter(node_id=node_id, index=index).first()
    if gpu is None:
        raise Http404(f"no GPU {index} on node '{node_id}'")
    back = reverse("console:node", args=[node_id])
    reason, error = "", ""
    if request.method == "POST":
        reason = request.POST.get("reason", "")
        try:
            if len(reason) > REASON_MAX:
                raise ValueError(f"a reason is at most {REASON_MAX} characters, not {len(reason)}")
            changed, text = gpu_health.clear(gpu, request.user, reason)
        except permissions.Refused as exc:
            raise PermissionDenied(str(exc)) from None
        except ValueError as exc:
            error = str(exc)  # asked again, nothing changed
        else:
            messages.add_message(request, messages.SUCCESS if changed else messages.INFO, text)
            return redirect(back)
    elif not may_clear(request.user):
        raise PermissionDenied("clearing a GPU's fault needs the permission fleet.drain_node")
    health = gpu.health + (f" ({gpu.health_reason})" if gpu.health_reason else "")
    response = render(
        request,
        "console/confirm.html",
        admin_context(
            request,
            f"Clear GPU {gpu}?",
            kind="gpu",
            target=str(gpu),
            back_url=back,
            back_label=node_id,
            action="clear",
            label="Clear the fault of",
            warning=(
                f"GPU {gpu} is {health}. Clearing its fault lets replicas be placed on it "
                "again; do it once it was reset or replaced, or the fault was the driver's. "
                "What the agent reads on it now (retired pages, slowdowns) still counts."
            ),
            ask_reason=True,
            reason=reason,
            reason_max=REASON_MAX,
            reason_hint="reset with nvidia-smi -r; dcgmi diag -r 3 passed",
            error=error,
        ),
    )
    if error:
        response.status_code = 400
    return response
