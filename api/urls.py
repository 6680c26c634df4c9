"""Routes of the node protocol (GitLab's paths), the operator API, its OpenAPI schema and
the schema's browsable page."""

from django.conf import settings
from django.urls import include, path

from api import views
from api.schema import SchemaPageView, SchemaView

urlpatterns = [
    # An operator's in production, anyone's in development (api.schema.SchemaReader).
    path("api/schema/", SchemaView.as_view(), name="schema"),
    path("api/schema/ui/", SchemaPageView.as_view(), name="schema-ui"),
    path(
        "api/v4/internal/search/zoekt/<str:uuid>/heartbeat",
        views.HeartbeatView.as_view(),
        name="zoekt-heartbeat",
    ),
    path(
        "api/v4/internal/search/zoekt/<str:uuid>/callback",
        views.CallbackView.as_view(),
        name="zoekt-callback",
    ),
    path("", include("api.search_urls")),
    path("", include("api.operator_urls")),
]

if settings.ZOEKT_BENCH_ENDPOINTS:
    from api import bench_views

    urlpatterns += [
        path("bench/floor/<str:uuid>/heartbeat", bench_views.FloorHeartbeatView.as_view()),
        path("bench/ceiling/<str:uuid>/heartbeat", bench_views.CeilingHeartbeatView.as_view()),
    ]
