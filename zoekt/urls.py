"""URL routes: the admin and its dashboard, health probe, metrics and OpenAPI schema."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from zoekt import dashboard, metrics, views

urlpatterns = [
    # Before admin/ so the admin's catch-all does not take these paths.
    path("admin/dashboard/", include(dashboard.urls())),
    path("admin/", admin.site.urls),
    path("-/health", views.health, name="health"),
    path("metrics", metrics.metrics, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("", include("api.urls")),
]
