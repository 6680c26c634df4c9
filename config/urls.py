"""URL routes: the admin and its dashboard, health probe, metrics and OpenAPI schema (api's).

The project's wiring: the other apps' routes are included by name.
"""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from zoekt import views

urlpatterns = [
    # The site's root (the admin's "View site" link) is the dashboard.
    path("", RedirectView.as_view(pattern_name="dashboard-fleet"), name="home"),
    # Before admin/ so the admin's catch-all does not take admin/dashboard/.
    path("", include("dashboard.urls")),
    path("admin/", admin.site.urls),
    path("-/health", views.health, name="health"),
    path("", include("api.urls")),
    path("", include("gitlab_sync.urls")),
    path("", include("eviction.urls")),
]

# A path no route matches (an id that is not an integer, say): JSON under /api/.
handler404 = "api.errors.not_found"
