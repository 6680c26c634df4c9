"""GitLab's REST entities as catalog rows (pure: dicts in, dicts out, no Django).

The rows are those of ``POST /api/v1/catalog/bulk_upsert`` (GitLab's column
names), so the sweep writes through the same upsert as every other writer.

**The project namespace id.** GitLab's REST API does not expose a project's
``project_namespace_id`` (the project entity's ``namespace`` is its parent,
and the system hooks' ``project_namespace_id`` is the parent's id too), yet
the planner's index ranges are ranges of it. Following GitLab over REST, the
control plane keys each project's namespace by a surrogate,
``PROJECT_NAMESPACE_ID_BASE + project_id``:

* it is stable: a project's id never changes, so a renamed or transferred
  project keeps its place in its index's range (a transfer to another root
  moves it between enabled namespaces, through the normal pipeline);
* it keeps the order of project ids, which is GitLab's creation order, as the
  real ids' order is, so ranges split the namespace as GitLab's would;
* it never meets a real namespace id: ``1e15`` is far above any id GitLab
  hands out (a group or user namespace id at or above it stops the sweep),
  and below 2**53, so it survives a JSON number anywhere.

docs/gitlab.md states the decision and its consequences.
"""

from __future__ import annotations

from typing import Any

#: Where the surrogate project namespace ids start (docs/gitlab.md).
PROJECT_NAMESPACE_ID_BASE = 10**15

#: GitLab's ``visibility`` strings as ``visibility_level`` (Gitlab::VisibilityLevel).
VISIBILITY_LEVELS = {"private": 0, "internal": 10, "public": 20}
#: The REST ``repository_access_level`` strings as ProjectFeature's integers.
ACCESS_LEVELS = {"disabled": 0, "private": 10, "enabled": 20}


class Unmappable(ValueError):
    """An entity the catalog cannot hold as it stands (named in the sweep's record)."""


def project_namespace_id(project_id: int) -> int:
    return PROJECT_NAMESPACE_ID_BASE + project_id


def _name(entity: dict) -> str:
    return str(entity.get("name") or entity.get("path") or entity["id"])


def _checked_namespace_id(value: Any) -> int:
    if not isinstance(value, int) or value <= 0:
        raise Unmappable(f"namespace id {value!r} is not a positive integer")
    if value >= PROJECT_NAMESPACE_ID_BASE:
        raise Unmappable(
            f"namespace id {value} reaches the surrogate project namespace ids "
            f"({PROJECT_NAMESPACE_ID_BASE:,} and up)"
        )
    return value


def group_row(group: dict) -> dict:
    """A ``GET /groups`` entity as a ``namespaces`` row of type Group."""
    parent = group.get("parent_id")
    return {
        "id": _checked_namespace_id(group.get("id")),
        "name": _name(group),
        "path": str(group.get("path") or group["id"]),
        "type": "Group",
        "parent_id": None if parent is None else _checked_namespace_id(parent),
        "visibility_level": VISIBILITY_LEVELS.get(group.get("visibility"), 0),
        "archived": bool(group.get("archived", False)),
    }


def user_namespace_row(namespace: dict) -> dict:
    """A ``GET /namespaces`` entity of kind ``user`` as a ``namespaces`` row of type User."""
    return {
        "id": _checked_namespace_id(namespace.get("id")),
        "name": _name(namespace),
        "path": str(namespace.get("path") or namespace["id"]),
        "type": "User",
        "parent_id": None,
        # A personal namespace has no visibility of its own; its projects carry theirs.
        "visibility_level": VISIBILITY_LEVELS["public"],
        "archived": False,
    }


def project_rows(project: dict) -> tuple[dict, dict, dict | None]:
    """A ``GET /projects?statistics=true`` entity as its three catalog rows: its project
    namespace (the surrogate id), the project, its statistics (None when GitLab has none:
    ``statistics`` null or absent, see ``statistics_row``)."""
    project_id = project.get("id")
    if not isinstance(project_id, int) or project_id <= 0:
        raise Unmappable(f"project id {project_id!r} is not a positive integer")
    parent = (project.get("namespace") or {}).get("id")
    parent_id = _checked_namespace_id(parent)
    visibility = VISIBILITY_LEVELS.get(project.get("visibility"), 0)
    archived = bool(project.get("archived", False))
    path = str(project.get("path") or project_id)
    own_namespace = {
        "id": project_namespace_id(project_id),
        "name": _name(project),
        "path": path,
        "type": "Project",
        "parent_id": parent_id,
        "visibility_level": visibility,
        "archived": archived,
    }
    fork = project.get("forked_from_project") or {}
    row = {
        "id": project_id,
        "name": _name(project),
        "path": path,
        "namespace_id": parent_id,
        "project_namespace_id": own_namespace["id"],
        "visibility_level": visibility,
        "archived": archived,
        "repository_storage": project.get("repository_storage") or "default",
        "repository_access_level": ACCESS_LEVELS.get(
            project.get("repository_access_level") or "enabled", ACCESS_LEVELS["enabled"]
        ),
        "forked_from_project_id": fork.get("id") if isinstance(fork.get("id"), int) else None,
    }
    return own_namespace, row, statistics_row(project_id, project.get("statistics"))


def statistics_row(project_id: int, statistics: Any) -> dict | None:
    """A project's ``statistics`` object as its ``project_statistics`` row, or None.

    GitLab answers ``statistics: null`` for a project that has no statistics yet (they are
    computed asynchronously); such a project gets no row, as in GitLab, and the planner
    treats it as a project without statistics (docs/planner.md), never as a 0-byte one.
    An existing row is then left as it is: the catalog keeps the last sizes GitLab gave.
    Inside a statistics object a size GitLab left out is 0 (its columns default to 0).
    """
    if not isinstance(statistics, dict):
        return None
    return {
        "project_id": project_id,
        "repository_size": _size(statistics.get("repository_size")),
        "storage_size": _size(statistics.get("storage_size")),
    }


def _size(value: Any) -> int:
    """GitLab's sizes are bytes (integers, sometimes sent as floats); absent is 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return 0
    return int(value)
