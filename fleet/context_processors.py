"""Fleet-wide warnings shown above every admin page (templates/admin/base_site.html)."""

from fleet.services.reconciler.expiry import fleet_warnings


def fleet_banner(request) -> dict:
    # Admin pages only: nothing else shows them, and the query is not free.
    if not request.path.startswith("/admin/") or not getattr(request.user, "is_staff", False):
        return {}
    return {"fleet_warnings": fleet_warnings()}
