"""Who may do what through the management API: Django's model permissions, as in the admin."""

from rest_framework.permissions import SAFE_METHODS, DjangoModelPermissions

from fleet.services import teams


class FleetModelPermissions(DjangoModelPermissions):
    """The model permissions the admin asks for, per method; an action names its own.

    Unlike DRF's DjangoModelPermissions, reading needs ``view_<model>``, as the
    admin's pages do: a staff user without permissions sees nothing in either. An
    imperative action (``drain``, ``cordon``) is a POST that creates nothing, so
    it does not ride on ``add_<model>``: the viewset lists what each one needs in
    ``action_permissions``.

    A write to one model, profile, replica or API key also needs it to be in the
    user's team's scope (fleet.services.teams): the same permissions asked of the
    object, which django-rules answers; the 403 says whose it is.
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

    def has_object_permission(self, request, view, obj):
        if request.method in SAFE_METHODS or not teams.owned(obj):
            return True
        needed = getattr(view, "action_permissions", {}).get(getattr(view, "action", None))
        if needed is None:
            needed = self.get_required_permissions(request.method, type(obj))
        scoped = [p for p in needed if p in teams.SCOPED]
        if request.user.has_perms(scoped, obj):
            return True
        what = f"{view.action.replace('_', ' ')} {obj._meta.verbose_name} '{obj}'"
        self.message = teams.problem(request.user, teams.team_of(obj), what)
        return False
