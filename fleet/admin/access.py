"""Join tokens, node credentials and API keys.

A new secret is shown once, on the page that answers the add form, and is
stored nowhere but as a hash: not in the database, not in a message cookie.
"""

from datetime import timedelta

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import F, Q
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html_join

from fleet.models import ApiKey, ApiKeyScope, JoinToken, KeyUsage, Model, NodeCredential
from fleet.services import access, api_keys, doorbells, permissions, teams
from fleet.services.api_keys import LIMIT_FIELDS as LIMITS

from .common import ReadOnlyAdmin, TeamScoped


def _status(obj) -> str:
    return obj.usable() or "usable"


class SecretStatusFilter(admin.SimpleListFilter):
    """Usable, revoked or expired: what operators ask of a secret, rather than dates."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        choices = [("usable", "usable"), ("revoked", "revoked")]
        if model_admin.model is not NodeCredential:
            choices.append(("expired", "expired or used up"))
        return choices

    def queryset(self, request, queryset):
        expired = Q(pk__in=[])  # a node credential does not expire
        if queryset.model is not NodeCredential:
            expired = Q(expires_at__lte=timezone.now())
        if queryset.model is JoinToken:
            expired |= Q(uses__gte=F("max_uses"))
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        if self.value() == "expired":
            return queryset.filter(expired, revoked_at__isnull=True)
        if self.value() == "usable":
            return queryset.filter(revoked_at__isnull=True).exclude(expired)
        return queryset


class SecretOnceMixin:
    """Creates the row through a service, then answers with the secret, once."""

    secret_hint = ""

    def issue(self, request, form):
        """Create the row through its service; returns (row, secret)."""
        raise NotImplementedError

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        row, secret = self.issue(request, form)
        # The admin goes on with `obj` (history, the answer page): make it the row
        # the service created rather than a second, unsaved copy.
        obj.pk = row.pk
        obj.refresh_from_db()
        obj._state.adding = False
        request._llmgw_new_secret = secret

    def response_add(self, request, obj, post_url_continue=None):
        secret = getattr(request, "_llmgw_new_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        opts = self.opts
        context = {
            **self.admin_site.each_context(request),
            "opts": opts,
            "title": f"New {opts.verbose_name}: {obj}",
            "object": obj,
            "secret": secret,
            "hint": self.secret_hint.format(secret=secret),
            "change_url": reverse(
                f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]
            ),
            "changelist_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"),
        }
        response = TemplateResponse(request, "admin/fleet/secret_once.html", context)
        add_never_cache_headers(response)
        return response


class JoinTokenCreateForm(forms.ModelForm):
    lifetime = forms.CharField(
        initial="24h", help_text="How long it can enrol nodes: 30m, 24h, 7d…"
    )
    max_uses = forms.IntegerField(
        min_value=1, initial=1, label="Max uses", help_text="How many nodes it may enrol."
    )

    class Meta:
        model = JoinToken
        fields = ("name",)

    def clean_lifetime(self):
        try:
            return api_keys.parse_duration(self.cleaned_data["lifetime"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(JoinToken)
class JoinTokenAdmin(SecretOnceMixin, admin.ModelAdmin):
    list_display = (
        "name",
        "prefix",
        "status",
        "uses_display",
        "expires_at",
        "created_at",
        "created_by",
    )
    list_filter = (SecretStatusFilter,)
    search_fields = ("name", "prefix")
    list_select_related = ("created_by",)
    actions = ("revoke_tokens",)
    secret_hint = (
        "Give it to the agent of each new node: it enrols once and receives a credential of "
        "its own."
    )
    readonly_fields = (
        "prefix",
        "status",
        "uses_display",
        "max_uses",
        "expires_at",
        "created_at",
        "created_by",
        "revoked_at",
    )

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = JoinTokenCreateForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("name", "lifetime", "max_uses")
        return ("name", *self.readonly_fields)

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else self.readonly_fields

    def issue(self, request, form):
        return access.create_join_token(
            form.cleaned_data["name"],
            ttl=form.cleaned_data["lifetime"],
            max_uses=form.cleaned_data["max_uses"],
            actor=request.user,
        )

    @admin.display(description="status")
    def status(self, obj):
        return _status(obj)

    @admin.display(description="uses")
    def uses_display(self, obj):
        return f"{obj.uses} of {obj.max_uses}"

    def has_revoke_permission(self, request, obj=None):
        return permissions.allowed(request.user, "join_token.revoke")

    @admin.action(description="Revoke: enrol no more nodes", permissions=["revoke"])
    def revoke_tokens(self, request, queryset):
        try:
            done = sum(access.revoke_join_token(t, actor=request.user) for t in queryset)
        except permissions.Refused as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        self.message_user(request, f"revoked {done} join token(s)")


@admin.register(NodeCredential)
class NodeCredentialAdmin(ReadOnlyAdmin):
    list_display = ("node", "prefix", "status", "created_at", "last_used_at", "join_token")
    list_filter = (SecretStatusFilter,)
    search_fields = ("node__id", "prefix")
    list_select_related = ("node", "join_token")

    @admin.display(description="status")
    def status(self, obj):
        return "revoked" if obj.revoked else "active"


class ApiKeyForm(forms.ModelForm):
    allowed_models = forms.ModelMultipleChoiceField(
        queryset=Model.objects.all(),
        to_field_name="name",
        required=False,
        help_text="Inference keys only. None selected: every model.",
    )

    class Meta:
        model = ApiKey
        fields = (
            "name",
            "scope",
            "user",
            "team",
            "allowed_models",
            "fallbacks",
            "expires_at",
            *LIMITS,
        )

    # The user asking (ApiKeyAdmin.get_form): the owner of a new key whose form has no
    # user field, or whose user field is left empty.
    acting_user = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "share_weight" in self.fields:
            self.fields["share_weight"].required = False
        if "user" in self.fields:
            self.fields["user"].queryset = get_user_model().objects.filter(is_active=True)
            self.fields[
                "user"
            ].help_text = "Whose key it is; a manage key acts as them. Empty: yours."

    def owner(self, data):
        """Whose key this form makes or edits."""
        if self.instance.pk is not None:
            return self.instance.user
        return data.get("user") or self.acting_user

    def clean_allowed_models(self):
        return sorted(m.name for m in self.cleaned_data["allowed_models"])

    def clean_share_weight(self):
        return self.cleaned_data.get("share_weight") or 1  # left empty: the default

    def clean_fallbacks(self):
        found = self.cleaned_data["fallbacks"]
        return [] if found is None else found  # an emptied field: none

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        instance = self.instance
        try:
            if instance.pk is None:
                api_keys.check_actor(self.acting_user, "api_key.create", self.owner(data), "mint")
        except permissions.Refused as exc:
            self.add_error("user" if "user" in self.fields else None, str(exc))
            return data
        if instance.pk is None:
            try:
                data["team"] = teams.team_for_new(self.acting_user, data.get("team"), "an API key")
            except permissions.Refused as exc:
                self.add_error("team" if "team" in self.fields else None, str(exc))
                return data
        try:
            api_keys.check_api_key(
                data.get("name", instance.name),
                scope=data.get("scope", instance.scope),
                user=self.owner(data),
                allowed_models=data.get("allowed_models"),
                # An existing key may keep an expiry that has passed; a new one may not.
                expires_at=data.get("expires_at") if instance.pk is None else None,
                fallbacks=data.get("fallbacks"),
                team=data["team"] if "team" in data else instance.team_id,
            )
        except api_keys.ApiKeyError as exc:
            field = exc.field if exc.field in self.fields else None
            self.add_error(field, str(exc))
        return data


@admin.register(ApiKey)
class ApiKeyAdmin(TeamScoped, SecretOnceMixin, admin.ModelAdmin):
    form = ApiKeyForm
    list_display = (
        "name",
        "prefix",
        "scope",
        "user",
        "team",
        "status",
        "allowed",
        "expires_at",
        "last_used_at",
    )
    list_filter = ("scope", "team", SecretStatusFilter)
    search_fields = ("name", "prefix", "user__username")
    list_select_related = ("user", "team")
    actions = ("revoke_keys",)
    secret_hint = "Send it as 'Authorization: Bearer {secret}'."

    def has_others_permission(self, request, obj=None):
        return request.user.has_perm(permissions.OTHERS_API_KEYS)

    def has_revoke_permission(self, request, obj=None):
        return permissions.allowed(request.user, "api_key.revoke")

    def has_delete_permission(self, request, obj=None):
        # Deleting a key is revoking it for good: another's needs what revoking it does.
        if not super().has_delete_permission(request, obj):
            return False
        return obj is None or obj.user_id == request.user.pk or self.has_others_permission(request)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"acting_user": request.user})

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return (
            "prefix",
            "scope",
            "user",
            "team",
            "status",
            "created_at",
            "last_used_at",
            "revoked_at",
            "previous_secret_expires_at",
            "usage_by_model",
        )

    def get_fields(self, request, obj=None):
        if obj is None:
            # Without the permission for others' keys, a new key is the asking user's own:
            # the form offers no owner to choose and takes none from a post.
            owner = ("user",) if self.has_others_permission(request) else ()
            return (
                "name",
                "scope",
                *owner,
                "team",
                "allowed_models",
                "fallbacks",
                "expires_at",
                *LIMITS,
            )
        return (
            "name",
            "allowed_models",
            "fallbacks",
            "expires_at",
            *LIMITS,
            *self.get_readonly_fields(request, obj),
        )

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change:
            # Limits and models are cached by the gateways: ring them.
            doorbells.ring_gateways("keys")

    def issue(self, request, form):
        data = form.cleaned_data
        return api_keys.create_api_key(
            data["name"],
            scope=data["scope"],
            user=form.owner(data),
            allowed_models=data["allowed_models"],
            expires_at=data.get("expires_at"),
            limits={f: data.get(f) for f in LIMITS},
            fallbacks=data.get("fallbacks") or [],
            team=data.get("team"),
            actor=request.user,
        )

    @admin.display(description="usage, last 30 days")
    def usage_by_model(self, obj):
        since = timezone.now() - timedelta(days=30)
        totals = api_keys.usage_totals(api_keys.usage(key=obj.prefix, since=since))
        if not totals:
            return "none counted"
        return format_html_join(
            "",
            "<div>{}: {} requests, {} prompt + {} completion tokens</div>",
            (
                (t["model"], t["requests"], t["prompt_tokens"], t["completion_tokens"])
                for t in totals
            ),
        )

    @admin.display(description="status")
    def status(self, obj):
        return _status(obj)

    @admin.display(description="models")
    def allowed(self, obj):
        if obj.scope == ApiKeyScope.MANAGE:
            return "-"
        return ", ".join(obj.allowed_models) or "all"

    @admin.action(description="Revoke: refuse these keys from now on", permissions=["revoke"])
    def revoke_keys(self, request, queryset):
        try:
            done = api_keys.revoke_api_keys(queryset.select_related("user"), actor=request.user)
        except permissions.Refused as exc:
            self.message_user(request, f"{exc}; none revoked", messages.ERROR)
            return
        self.message_user(request, f"revoked {done} API key(s)", messages.WARNING)


@admin.register(KeyUsage)
class KeyUsageAdmin(ReadOnlyAdmin):
    """Tokens per key, model and hour, as the gateways count them (written in batches)."""

    list_display = ("hour", "key", "model", "requests", "prompt_tokens", "completion_tokens")
    list_filter = ("model", "key")
    search_fields = ("key__name", "key__prefix", "model")
    date_hierarchy = "hour"
    list_select_related = ("key",)
