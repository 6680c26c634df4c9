"""The dashboard's routes: its pages inside the admin, and the Prometheus exposition.

``config.urls`` mounts these before the admin, so the admin's catch-all does
not take ``admin/dashboard/``. The URL names are the ones the templates and
the admin's index reverse.
"""

from django.urls import include, path

from dashboard import capacity_views, metrics, views

urlpatterns = [
    path("admin/dashboard/", include(views.urls())),
    path("metrics", metrics.metrics, name="metrics"),
    path("api/v1/capacity", capacity_views.CapacityView.as_view(), name="capacity"),
]
