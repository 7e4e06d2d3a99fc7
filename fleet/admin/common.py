"""Pieces the fleet admin pages share."""

from django.contrib import admin

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


def human_bytes(value) -> str:
    return bytes_text(value)


def count_message(done: int, total: int, verb: str, already: str) -> str:
    """'cordoned 2 nodes (1 already cordoned)'."""
    text = f"{verb} {done} node{'s' if done != 1 else ''}"
    if total - done:
        text += f" ({total - done} {already})"
    return text
