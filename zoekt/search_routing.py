"""The routing view of a namespace search, for operators (the GitLab integration reference, 5).

``search_targets`` says which index on which node serves each part of a namespace;
``search_routing`` says the same with the figures an operator checks routing by. It is
**not** what GitLab sends: the request GitLab's proxy takes is built by
``zoekt.search_requests`` for a caller's query and project ids. This view gives:

* **the nodes a search fans out to**: one ``forward_to`` entry per node (``endpoint``:
  the node's ``search_base_url``), with its replica, the project-namespace ranges it
  is asked for (a node may hold a namespace's repositories that another index now
  serves: a move's source, a re-split's narrowed index) and the number of searchable
  projects it serves; the namespace's traversal-id prefix (``^<root id>-``); the node
  a request would be proxied through when it asks for every project (the node serving
  the most projects, ties to the lowest node id) and the URL GitLab posts to on it;
* **the legacy targets map** (GitLab's ``RoutingService``):
  ``{zoekt_node_id: [project_id, ...]}``, each searchable project once, on the node
  whose index serves its range. Like GitLab's, it is not given for more than 30,000
  projects (``targets`` is then null and ``targets_omitted`` says why).

No target, no routing: ``search_enabled`` is false and ``reason`` says why, as in
``search_targets``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from zoekt.models import Repository
from zoekt.search_targets import HIGHEST, LOWEST, SearchTargets, search_targets

#: GitLab's RoutingService::MAX_NUMBER_OF_PROJECTS.
MAX_TARGET_PROJECTS = 30_000
#: Where GitLab posts a proxied search on the proxy node (PROXY_SEARCH_PATH).
PROXY_SEARCH_PATH = "/webserver/api/v2/search"


def _in(value: int | None, low: int | None, high: int | None) -> bool:
    if value is None:
        return False
    return (LOWEST if low is None else low) <= value <= (HIGHEST if high is None else high)


def proxy_url(search_base_url: str) -> str:
    """Where GitLab posts a proxied search on a node."""
    return search_base_url.rstrip("/") + PROXY_SEARCH_PATH


def served_projects(
    answer: SearchTargets, project_ids: Iterable[int] | None = None
) -> dict[int, list[int]]:
    """``{node_id: [project_id, ...]}`` of every target node (ids ascending): the
    projects each serves, of ``project_ids`` (all when None). A project is served by
    the node of the target index whose asked range holds its project namespace id,
    where its repository is searchable; the asked ranges of a cover never overlap, so
    a project is served once at most (a node's leftover outside its range: never)."""
    served: dict[int, list[int]] = {target.node_id: [] for target in answer.targets}
    spans = {
        index.index_id: (
            target.node_id,
            index.project_namespace_id_from,
            index.project_namespace_id_to,
        )
        for target in answer.targets
        for index in target.indices
    }
    if not spans:
        return served
    rows = Repository.objects.filter(
        zoekt_index_id__in=list(spans),
        state__in=Repository.SEARCHABLE_STATES,
        project_id__isnull=False,
    )
    if project_ids is not None:
        wanted = sorted(set(project_ids))
        if not wanted:
            return served
        rows = rows.filter(project_id__in=wanted)
    seen: set[int] = set()
    for index_id, project_id, project_namespace_id in (
        rows.values_list("zoekt_index_id", "project_id", "project__project_namespace_id")
        .order_by("project_id")
        .iterator()
    ):
        node_id, low, high = spans[index_id]
        if project_id not in seen and _in(project_namespace_id, low, high):
            seen.add(project_id)
            served[node_id].append(project_id)
    return served


def search_routing(root_namespace_id: int, now: datetime | None = None) -> dict[str, Any]:
    """The routing view of a search of ``root_namespace_id`` (see the module)."""
    answer = search_targets(root_namespace_id, now)
    view: dict[str, Any] = {
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
        return view
    served = served_projects(answer)
    view["forward_to"] = [
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
    view["proxy"] = {
        "node_id": proxy.node_id,
        "search_base_url": proxy.search_base_url,
        "url": proxy_url(proxy.search_base_url),
    }
    total = sum(len(ids) for ids in served.values())
    if total > MAX_TARGET_PROJECTS:
        view["targets"] = None
        view["targets_omitted"] = f"more than {MAX_TARGET_PROJECTS:,} projects ({total:,})"
    else:
        view["targets"] = {str(node_id): ids for node_id, ids in served.items() if ids}
    return view
