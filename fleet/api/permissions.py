"""Who may do what through the management API: Django's model permissions, as in the admin."""

from rest_framework.permissions import DjangoModelPermissions


class FleetModelPermissions(DjangoModelPermissions):
    """The model permissions the admin asks for, per method; an action names its own.

    Unlike DRF's DjangoModelPermissions, reading needs ``view_<model>``, as the
    admin's pages do: a staff user without permissions sees nothing in either. An
    imperative action (``drain``, ``cordon``) is a POST that creates nothing, so
    it does not ride on ``add_<model>``: the viewset lists what each one needs in
    ``action_permissions``.
    """

    perms_map = {
        **DjangoModelPermissions.perms_map,
        "GET": ["%(app_label)s.view_%(model_name)s"],
        "HEAD": ["%(app_label)s.view_%(model_name)s"],
        "OPTIONS": ["%(app_label)s.view_%(model_name)s"],
    }

    def has_permission(self, request, view):
        needed = getattr(view, "action_permissions", {}).get(getattr(view, "action", None))
        if needed is None:
            return super().has_permission(request, view)
        user = request.user
        return bool(user and user.is_authenticated and user.has_perms(needed))
