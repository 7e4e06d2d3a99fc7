"""Single sign-on through OpenID Connect (docs/security.md, "Single sign-on").

mozilla-django-oidc does the protocol: the redirect to the provider with PKCE
and a nonce, the code for tokens, the ID token's signature against the
provider's keys, the userinfo. What is ours is who a signed-in person is here:

- a user is made on first sign-in, named by ``preferred_username`` (else the
  email), with no password: the provider is the only way in for it;
- the groups claim (``LLMGW_OIDC_GROUPS_CLAIM``, ``groups``) names Django groups,
  and so permissions: each sign-in sets the user's groups to the named ones
  that exist here. Someone in none of them is refused, as is a name that
  belongs to a local account (those stay for break-glass, password only);
- signing out of llmgw signs out at the provider too (its end-session
  endpoint), for a session that signed in there.

Settings come from the environment (llmgw_site/settings.py); SSO is on when
``LLMGW_OIDC_CLIENT_ID`` is set.
"""

from __future__ import annotations

import logging
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.models import Group
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

logger = logging.getLogger(__name__)


def enabled() -> bool:
    return bool(getattr(settings, "OIDC_RP_CLIENT_ID", ""))


class Backend(OIDCAuthenticationBackend):
    def _name(self, claims) -> str:
        return (claims.get("preferred_username") or claims.get("email") or "").strip()

    def _groups(self, claims) -> list[Group]:
        named = claims.get(settings.LLMGW_OIDC_GROUPS_CLAIM) or []
        if isinstance(named, str):
            named = [named]
        return list(Group.objects.filter(name__in=[n for n in named if isinstance(n, str)]))

    def verify_claims(self, claims) -> bool:
        name = self._name(claims)
        if not name:
            logger.warning("sso refused: the provider named no preferred_username or email")
            return False
        if not self._groups(claims):
            logger.warning(
                "sso refused user=%s: none of its groups %s is a group here",
                name,
                claims.get(settings.LLMGW_OIDC_GROUPS_CLAIM),
            )
            return False
        return True

    def filter_users_by_claims(self, claims):
        found = self.UserModel.objects.filter(**{self.UserModel.USERNAME_FIELD: self._name(claims)})
        local = [u for u in found if u.has_usable_password()]
        if local:
            # A local account (break-glass): the provider never signs in as it.
            logger.warning("sso refused user=%s: a local account has that name", local[0])
            return self.UserModel.objects.none()
        return found

    def create_user(self, claims):
        name = self._name(claims)
        if self.UserModel.objects.filter(**{self.UserModel.USERNAME_FIELD: name}).exists():
            raise PermissionError(f"'{name}' is a local account; sign in with its password")
        user = self.UserModel.objects.create_user(name, email=claims.get("email", ""))
        logger.info("sso user created user=%s", name)
        return self.update_user(user, claims)

    def update_user(self, user, claims):
        user.email = claims.get("email", user.email)
        user.is_staff = True  # the admin and the console; what they may do is the groups'
        user.save(update_fields=["email", "is_staff"])
        user.groups.set(self._groups(claims))
        return user

    def authenticate(self, request, **kwargs):
        try:
            return super().authenticate(request, **kwargs)
        except PermissionError as exc:
            logger.warning("sso refused: %s", exc)
            return None


def provider_logout(request) -> str:
    """Where signing out sends the browser: the provider's end-session endpoint for a
    session that signed in there (with its ID token as the hint), else the login page."""
    login = request.build_absolute_uri(reverse("admin:login"))
    id_token = request.session.get("oidc_id_token")
    end = getattr(settings, "OIDC_OP_END_SESSION_ENDPOINT", "")
    if not (id_token and end):
        return login
    query = {"id_token_hint": id_token, "post_logout_redirect_uri": login}
    return f"{end}?{urlencode(query)}"
