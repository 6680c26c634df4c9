"""Routes of the search API of one root namespace."""

from django.urls import path

from api import search_views

urlpatterns: list = [
    path(
        "api/v1/namespaces/<int:root_namespace_id>/search_targets",
        search_views.SearchTargetsView.as_view(),
        name="zoekt-search-targets",
    ),
    path(
        "api/v1/namespaces/<int:root_namespace_id>/search_routing",
        search_views.SearchRoutingView.as_view(),
        name="zoekt-search-routing",
    ),
    path(
        "api/v1/namespaces/<int:root_namespace_id>/search_request",
        search_views.SearchRequestView.as_view(),
        name="zoekt-search-request",
    ),
]
