from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    # Before the admin's own URLs, whose catch-all would answer these 404.
    path("admin/cluster/", include("fleet.console.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("fleet.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("", include("fleet.urls")),
]
