"""Pieces the fleet admin pages share."""

from django.contrib import admin

from fleet.models import Model
from fleet.services import teams
from fleet.services.units import bytes_text


class ReadOnlyAdmin(admin.ModelAdmin):
    """A page for facts the control plane observes: viewable, never edited by hand."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyTabularInline(admin.TabularInline):
    extra = 0
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class TeamScoped:
    """For models, profiles and API keys: a member of a team changes only what that team
    owns and sees the rest read-only; a new one's team (or model) is chosen among those
    the user may give it to (fleet.services.teams). On an inline, ``obj`` is the parent."""

    def _scoped(self, request, obj, action: str, allowed: bool) -> bool:
        if not allowed or obj is None or not teams.owned(obj):
            return allowed
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.{action}_{opts.model_name}", obj)

    def has_change_permission(self, request, obj=None):
        return self._scoped(request, obj, "change", super().has_change_permission(request, obj))

    def has_delete_permission(self, request, obj=None):
        return self._scoped(request, obj, "delete", super().has_delete_permission(request, obj))

    def has_add_permission(self, request, *args):
        allowed = super().has_add_permission(request, *args)
        parent = args[0] if args else None  # an inline's: adding a profile changes it
        if not allowed or parent is None or not teams.owned(parent):
            return allowed
        return request.user.has_perm("fleet.change_model", parent)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "team":
            kwargs["queryset"] = teams.assignable(request.user)
            mine = teams.teams_of(request.user)
            if not teams.manages_all(request.user) and mine:
                kwargs["required"] = True  # a member's things are their team's
                if len(mine) == 1:
                    kwargs["initial"] = next(iter(mine))
        elif db_field.name == "model" and db_field.related_model is Model:
            kwargs["queryset"] = teams.scope_filter(Model.objects.all(), request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


def human_bytes(value) -> str:
    return bytes_text(value)


def count_message(done: int, total: int, verb: str, already: str) -> str:
    """'cordoned 2 nodes (1 already cordoned)'."""
    text = f"{verb} {done} node{'s' if done != 1 else ''}"
    if total - done:
        text += f" ({total - done} {already})"
    return text


def rendered_with(var, value, view):
    """``view()``'s response, rendered while the context variable ``var`` holds ``value``:
    a changelist's columns read figures worked out once for the page, not once a row."""
    token = var.set(value)
    try:
        response = view()
        if hasattr(response, "render"):
            response.render()  # while the figures are set
        return response
    finally:
        var.reset(token)
