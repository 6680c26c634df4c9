"""Routes of the operator API (GitLab's admin endpoints and the catalog bulk upsert)."""

urlpatterns: list = []
