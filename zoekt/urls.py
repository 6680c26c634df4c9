"""URL routes: the admin and its dashboard, health probe, metrics and OpenAPI schema.

The project's wiring: the other apps' routes are included by name.
"""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from zoekt import views

urlpatterns = [
    # Before admin/ so the admin's catch-all does not take admin/dashboard/.
    path("", include("dashboard.urls")),
    path("admin/", admin.site.urls),
    path("-/health", views.health, name="health"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("", include("api.urls")),
]
