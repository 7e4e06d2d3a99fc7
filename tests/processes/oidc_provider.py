"""A real OpenID Connect provider for the single sign-on tests: django-oauth-toolkit's,
as a process of its own.

    python -m tests.processes.oidc_provider --port P --state DIR --setup setup.json

A Django project in one module, apart from llmgw's (its own settings, SQLite
database in DIR, RSA key made at start): OIDC on, RP-initiated logout on, a
``groups`` claim from the user's Django groups (scope ``profile``), PKCE
required. ``setup.json`` holds its users (username, password, email, groups)
and the one client, llmgw (client_id, client_secret, redirect_uri,
post_logout_redirect_uri); the client is trusted (no consent page). Its login
page is a plain form at /accounts/login/.

``start_oidc_provider`` runs it for a test; ``OidcProvider.endpoints`` are the
URLs llmgw's LLMGW_OIDC_* settings take.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

LOGIN_PAGE = """<!doctype html><title>Test identity provider</title>
<h1>Test identity provider</h1>
<form method="post">{% csrf_token %}{{ form.as_p }}
<button type="submit" id="sign-in">Sign in</button></form>"""


def configure(state: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from django.conf import settings

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["127.0.0.1", "localhost"],
        SECRET_KEY="the test identity provider's own",
        ROOT_URLCONF=__name__,
        USE_TZ=True,
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "oauth2_provider",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(state / "idp.db")}
        },
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": False,
                "OPTIONS": {
                    "context_processors": ["django.template.context_processors.request"],
                    "loaders": [
                        ("django.template.loaders.locmem.Loader", {"login.html": LOGIN_PAGE}),
                        "django.template.loaders.app_directories.Loader",
                    ],
                },
            }
        ],
        LOGIN_URL="/accounts/login/",
        # Browsers keep cookies by host, not port: llmgw on 127.0.0.1 beside it must
        # not lose its session (and the sign-in's state) to this one's.
        SESSION_COOKIE_NAME="idp_sessionid",
        CSRF_COOKIE_NAME="idp_csrftoken",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        OAUTH2_PROVIDER={
            "OIDC_ENABLED": True,
            "OIDC_RSA_PRIVATE_KEY": pem,
            "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
            "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,
            "PKCE_REQUIRED": True,
            "SCOPES": {
                "openid": "OpenID Connect",
                "email": "your email address",
                "profile": "your name and groups",
            },
            "OAUTH2_VALIDATOR_CLASS": f"{__name__}.Validator",
        },
    )


def _validator():
    from oauth2_provider.oauth2_validators import OAuth2Validator

    class Validator(OAuth2Validator):
        # The groups claim comes with the profile scope, as Keycloak's and Okta's do.
        oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "profile"}

        def get_additional_claims(self, request):
            user = request.user
            return {
                "preferred_username": user.get_username(),
                "email": user.email,
                "groups": sorted(g.name for g in user.groups.all()),
            }

    return Validator


def __getattr__(name: str):
    # OAUTH2_VALIDATOR_CLASS names it; made on first use, once Django is set up.
    if name == "Validator":
        return _validator()
    if name == "urlpatterns":
        from django.contrib.auth.views import LoginView
        from django.http import HttpResponse
        from django.urls import include, path

        return [
            path("favicon.ico", lambda request: HttpResponse(status=204)),
            path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
            path("accounts/login/", LoginView.as_view(template_name="login.html")),
        ]
    raise AttributeError(name)


def set_up(setup: dict) -> None:
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0)
    for u in setup["users"]:
        user = User.objects.create_user(u["username"], u.get("email", ""), u["password"])
        for name in u.get("groups", []):
            user.groups.add(Group.objects.get_or_create(name=name)[0])
    client = setup["client"]
    Application.objects.create(
        name="llmgw",
        client_id=client["client_id"],
        client_secret=client["client_secret"],
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=client["redirect_uri"],
        post_logout_redirect_uris=client["post_logout_redirect_uri"],
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--setup", type=Path, required=True)
    args = p.parse_args()
    configure(args.state)
    import django

    django.setup()
    set_up(json.loads(args.setup.read_text()))
    from django.core.servers.basehttp import run
    from django.core.wsgi import get_wsgi_application

    print(f"identity provider on 127.0.0.1:{args.port}", flush=True)
    run("127.0.0.1", args.port, get_wsgi_application(), threading=True)


# ---- for tests ------------------------------------------------------------------------------


@dataclass
class OidcProvider:
    url: str
    proc: subprocess.Popen
    client_id: str
    client_secret: str

    @property
    def settings(self) -> dict[str, str]:
        """llmgw's environment for signing in here."""
        o = f"{self.url}/o"
        return {
            "LLMGW_OIDC_CLIENT_ID": self.client_id,
            "LLMGW_OIDC_CLIENT_SECRET": self.client_secret,
            "LLMGW_OIDC_AUTHORIZATION_ENDPOINT": f"{o}/authorize/",
            "LLMGW_OIDC_TOKEN_ENDPOINT": f"{o}/token/",
            "LLMGW_OIDC_USERINFO_ENDPOINT": f"{o}/userinfo/",
            "LLMGW_OIDC_JWKS_ENDPOINT": f"{o}/.well-known/jwks.json",
            "LLMGW_OIDC_END_SESSION_ENDPOINT": f"{o}/logout/",
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_oidc_provider(tmp: Path, users: list[dict], llmgw_url: str) -> OidcProvider:
    from tests.processes.base import ROOT, free_port, wait_for_port

    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    client = {
        "client_id": "llmgw-console",
        "client_secret": "a-secret-the-test-made",
        "redirect_uri": f"{llmgw_url}/oidc/callback/",
        "post_logout_redirect_uri": f"{llmgw_url}/admin/login/",
    }
    setup = tmp / "setup.json"
    setup.write_text(json.dumps({"users": users, "client": client}))
    log = open(tmp / "idp.out", "wb")  # noqa: SIM115 - the process's, closed with it
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.processes.oidc_provider", "--port", str(port),
         "--state", str(tmp), "--setup", str(setup)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for_port(port, proc, timeout=60)
    except (RuntimeError, TimeoutError) as exc:
        raise RuntimeError(f"{exc}:\n{(tmp / 'idp.out').read_text()[-3000:]}") from None
    return OidcProvider(
        f"http://127.0.0.1:{port}", proc, client["client_id"], client["client_secret"]
    )


if __name__ == "__main__":
    main()
