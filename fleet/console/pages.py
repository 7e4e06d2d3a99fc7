"""What every console view shares: who may see it, and the admin's frame around it.

Pages (``page``) go through ``admin.site.admin_view``: a login page for anyone
not staff, then 403 without the page's permission. Fragments (``fragment``),
which scripts fetch, answer 403 instead of a login page that would land in the
middle of a table, and are never cached. The permission each page asks is named
here once (``NODES``, ``MODELS``, ``BATCHES``, ``COSTS``, ``WEIGHTS``). This
changes with how the console is guarded and framed; what a page shows is its
view's.
"""

import functools

from asgiref.sync import iscoroutinefunction
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseForbidden
from django.views.decorators.cache import never_cache

from fleet.services import cost_scope

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


def admin_context(request, title: str, **extra) -> dict:
    """A page's template context: the admin's frame (its header, its nav), and ``title``."""
    return {**admin.site.each_context(request), "title": title, **extra}
