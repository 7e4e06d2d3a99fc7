from django.conf import settings
from django.contrib import admin
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from mozilla_django_oidc.views import OIDCLogoutView

# Single sign-on (fleet/sso.py): the provider's way in, and out through it too.
sso = []
if settings.OIDC_RP_CLIENT_ID:
    sso = [
        path("oidc/", include("mozilla_django_oidc.urls")),
        path("admin/logout/", OIDCLogoutView.as_view(), name="sso-logout"),
    ]

urlpatterns = [
    *sso,
    # Before the admin's own URLs, whose catch-all would answer these 404.
    path("admin/cluster/", include("fleet.console.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("fleet.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    # The Batch API (/v1/files, /v1/batches): the one part of /v1 Django serves.
    path("v1/", include("fleet.batch_api.urls")),
    # Browsers ask every site for /favicon.ico; a 404 there is an error in each page's console.
    path("favicon.ico", lambda request: redirect(static("fleet/favicon.svg"))),
    path("", include("fleet.urls")),
]

# Under /api/ a path no route matches is a JSON 404 like the API's own (and a 500 JSON too).
handler404 = "fleet.api.exceptions.not_found"
handler500 = "fleet.api.exceptions.server_error"
