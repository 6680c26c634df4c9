"""A namespace search planned in GitLab's own shapes (the GitLab integration reference, 5).

``search_targets`` says which index on which node serves each part of a namespace;
``gitlab_plan`` says the same the way GitLab's search sends it:

* **the v2 proxy plan** (GitLab's traversal-id mode): one Zoekt webserver acts as
  proxy, ``POST <proxy search_base_url>/webserver/api/v2/search``, and fans out to the
  ``forward_to`` entries, one per node (``endpoint``: the node's ``search_base_url``),
  with the traversal-id prefix that scopes the query to the namespace (``^<root id>-``).
  GitLab's request puts its query AST in each entry (or once at the top level); the
  plan gives everything else. Each entry also says which project-namespace ranges the
  node serves, since a node may hold a namespace's repositories that another index now
  serves (a move's source, a re-split's narrowed index): a proxy that filters by them
  never counts a project twice. The proxy is the node serving the most projects (ties to
  the lowest node id), as GitLab picks it.
* **the legacy targets map** (GitLab's ``RoutingService``):
  ``{zoekt_node_id: [project_id, ...]}``, each ready project once, on the node whose
  index serves its range. Like GitLab's, it is not given for more than 30,000 projects
  (``targets`` is then null and ``targets_omitted`` says why).

No target, no plan: ``search_enabled`` is false and ``reason`` says why, as in
``search_targets``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from zoekt.models import Repository
from zoekt.search_targets import HIGHEST, LOWEST, search_targets

#: GitLab's RoutingService::MAX_NUMBER_OF_PROJECTS.
MAX_TARGET_PROJECTS = 30_000
#: Where GitLab posts a proxied search on the proxy node (PROXY_SEARCH_PATH).
PROXY_SEARCH_PATH = "/webserver/api/v2/search"


def _in(value: int | None, low: int | None, high: int | None) -> bool:
    if value is None:
        return False
    return (LOWEST if low is None else low) <= value <= (HIGHEST if high is None else high)


def gitlab_plan(root_namespace_id: int, now: datetime | None = None) -> dict[str, Any]:
    answer = search_targets(root_namespace_id, now)
    plan: dict[str, Any] = {
        "namespace_id": root_namespace_id,
        "search_enabled": answer.search_enabled,
        "reason": None if answer.reason is None else str(answer.reason),
        "version": 2,
        "traversal_ids_prefix": f"^{root_namespace_id}-",
        "proxy": None,
        "forward_to": [],
        "targets": {},
        "targets_omitted": None,
    }
    if not answer.targets:
        return plan
    ranges = {
        target.node_id: [
            (index.index_id, index.project_namespace_id_from, index.project_namespace_id_to)
            for index in target.indices
        ]
        for target in answer.targets
    }
    index_ids = [index_id for spans in ranges.values() for index_id, _, _ in spans]
    served: dict[int, list[int]] = {node_id: [] for node_id in ranges}
    node_of_index = {
        index_id: node_id for node_id, spans in ranges.items() for index_id, _, _ in spans
    }
    span_of_index = {
        index_id: (low, high) for spans in ranges.values() for index_id, low, high in spans
    }
    rows = (
        Repository.objects.filter(
            zoekt_index_id__in=index_ids,
            state__in=Repository.SEARCHABLE_STATES,
            project_id__isnull=False,
        )
        .values_list("zoekt_index_id", "project_id", "project__project_namespace_id")
        .order_by("project_id")
    )
    for index_id, project_id, project_namespace_id in rows.iterator():
        low, high = span_of_index[index_id]
        if _in(project_namespace_id, low, high):
            served[node_of_index[index_id]].append(project_id)
    plan["forward_to"] = [
        {
            "endpoint": target.search_base_url,
            "node_id": target.node_id,
            "node_name": target.node_name,
            "replica_id": target.replica_id,
            "project_namespace_id_ranges": [
                [index.project_namespace_id_from, index.project_namespace_id_to]
                for index in target.indices
            ],
            "projects": len(served[target.node_id]),
        }
        for target in answer.targets
    ]
    proxy = max(answer.targets, key=lambda t: (len(served[t.node_id]), -t.node_id))
    plan["proxy"] = {
        "node_id": proxy.node_id,
        "search_base_url": proxy.search_base_url,
        "url": proxy.search_base_url.rstrip("/") + PROXY_SEARCH_PATH,
    }
    total = sum(len(ids) for ids in served.values())
    if total > MAX_TARGET_PROJECTS:
        plan["targets"] = None
        plan["targets_omitted"] = f"more than {MAX_TARGET_PROJECTS:,} projects ({total:,})"
    else:
        plan["targets"] = {str(node_id): ids for node_id, ids in served.items() if ids}
    return plan
