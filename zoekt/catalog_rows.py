"""The catalog's rows as the bulk upsert takes them (plain dicts: no Django needed).

``zoekt.catalog.do_bulk_upsert_catalog`` takes them; the demo's
catalog, the replays and the tests build their rows here.
"""

from __future__ import annotations

__all__ = ["PUBLIC", "group_row", "project_rows"]

PUBLIC = 20  # GitLab's visibility_level and repository_access_level for public / enabled


def group_row(namespace_id: int, path: str, parent_id: int | None = None) -> dict:
    """A public group's row for ``do_bulk_upsert_catalog`` (name and path alike)."""
    return {
        "id": namespace_id,
        "name": path,
        "path": path,
        "type": "Group",
        "parent_id": parent_id,
        "visibility_level": PUBLIC,
        "archived": False,
    }


def project_rows(
    project_id: int,
    path: str,
    *,
    namespace_id: int,
    project_namespace_id: int,
    repository_size: int,
    storage_size: int | None = None,
    repository_storage: str = "default",
) -> tuple[dict, dict, dict]:
    """A public project's three rows: its project namespace, the project, its statistics."""
    project_namespace = {
        **group_row(project_namespace_id, path, namespace_id),
        "type": "Project",
    }
    project = {
        "id": project_id,
        "name": path,
        "path": path,
        "namespace_id": namespace_id,
        "project_namespace_id": project_namespace_id,
        "visibility_level": PUBLIC,
        "archived": False,
        "repository_storage": repository_storage,
        "repository_access_level": PUBLIC,
        "forked_from_project_id": None,
    }
    statistics = {
        "project_id": project_id,
        "repository_size": repository_size,
        "storage_size": repository_size if storage_size is None else storage_size,
    }
    return project_namespace, project, statistics
