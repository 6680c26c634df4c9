"""Routes of the search-target read API."""

from django.urls import path

from api import search_views

urlpatterns: list = [
    path(
        "api/v1/namespaces/<int:root_namespace_id>/search_targets",
        search_views.SearchTargetsView.as_view(),
        name="zoekt-search-targets",
    ),
    path(
        "api/v1/namespaces/<int:root_namespace_id>/search_plan",
        search_views.SearchPlanView.as_view(),
        name="zoekt-search-plan",
    ),
]
