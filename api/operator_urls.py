"""Routes of the operator API (GitLab's admin endpoints, the catalog bulk upsert and the
node shutdown records)."""

from django.urls import path

from api import operator_views as views

urlpatterns = [
    path(
        "api/v4/admin/zoekt/projects/<int:project_id>/index",
        views.ProjectIndexView.as_view(),
        name="zoekt-admin-index-project",
    ),
    # GitLab's :id is a namespace id or its URL-encoded full path (group%2Fsubgroup).
    path(
        "api/v4/admin/zoekt/namespaces/<path:namespace_ref>",
        views.NamespaceReplicasView.as_view(),
        name="zoekt-admin-namespace",
    ),
    path("api/v4/admin/zoekt/shards", views.NodeListView.as_view(), name="zoekt-admin-shards"),
    path(
        "api/v4/admin/zoekt/shards/<int:node_id>/indexed_namespaces",
        views.IndexedNamespaceListView.as_view(),
        name="zoekt-admin-indexed-namespaces",
    ),
    path(
        "api/v4/admin/zoekt/shards/<int:node_id>/indexed_namespaces/<int:namespace_id>",
        views.IndexedNamespaceView.as_view(),
        name="zoekt-admin-indexed-namespace",
    ),
    path(
        "api/v1/nodes/<int:node_id>/shutdown",
        views.NodeShutdownView.as_view(),
        name="node-shutdown",
    ),
    path("api/v1/nodes/<int:node_id>", views.NodeView.as_view(), name="node"),
    path(
        "api/v1/zones/<str:zone>/shutdown",
        views.ZoneShutdownView.as_view(),
        name="zone-shutdown",
    ),
    path(
        "api/v1/catalog/bulk_upsert",
        views.CatalogBulkUpsertView.as_view(),
        name="catalog-bulk-upsert",
    ),
]
