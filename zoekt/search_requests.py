"""GitLab's search request, built for a caller's query and project ids (the GitLab
integration reference, 5.3 and 5.4).

GitLab's search posts one request to a Zoekt webserver acting as proxy,
``POST <proxy search_base_url>/webserver/api/v2/search``, which fans it out to the
``forward_to`` entries and merges the answers. ``search_request`` builds that body
exactly as GitLab's targets mode does, key for key:

    {"version": 2, "timeout": "120s", "num_context_lines": 1,
     "max_file_match_window": 0, "max_file_match_results": 0,
     "max_line_match_window": 5000, "max_line_match_results": 5000,
     "max_line_match_results_per_file": 500,
     "forward_to": [{"query": {"and": {"children": [<query>, {"repo_ids": [...]}]}},
                     "endpoint": "<node search_base_url>"}, ...]}

with ``file_match_offset`` only when it is above 0, as GitLab sends it. Nothing of
ours is inside it (no node ids, replicas or ranges): what the proxy reads is GitLab's.

* **Each project once.** The requested projects (the permission-filtered set GitLab
  computes) are routed by coverage, as ``search_targets`` routes a namespace: a project
  goes to the node whose ready index serves its range, where its repository is
  searchable (``zoekt.search_routing.served_projects``). A node still holding a copy
  another index now serves (a move's source until its deletion, a re-split's narrowed
  index) is never asked for it, so no project is answered twice. One entry per node
  that serves at least one requested project, ids ascending, entries in node id order.
* **Ids above 2^32 - 1** do not fit Zoekt's repository ids: an entry holding one
  filters by GitLab's ``meta`` form instead,
  ``{"meta": {"key": "project_id", "value": "^(id1|id2|...)$"}}``.
* **Unrouted projects.** A requested project no ready index serves (not in the
  namespace, not indexed yet, ...) is left out of the body and listed in
  ``unrouted_project_ids``.
* **The proxy** is the ``node_id`` option when given (it must be one of the entries'
  nodes), else the node with the most projects in the request, ties to the lowest id.
* **At most 30,000 projects** (GitLab's ``RoutingService`` limit), counted once each.

No route (the namespace not enabled or not searchable, or none of the requested
projects served): ``search_enabled`` is false, ``reason`` says why (the codes of
``search_targets``, and ``no_requested_project_served``), ``proxy`` and ``request``
are null, and every requested id is unrouted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from zoekt.reasons import Reason
from zoekt.search_routing import MAX_TARGET_PROJECTS, proxy_url, served_projects
from zoekt.search_targets import search_targets

#: The largest id Zoekt's repository ids hold (uint32); above it, the meta form.
MAX_REPO_ID = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """The request options GitLab sends, with GitLab's defaults."""

    timeout: str = "120s"
    #: GitLab's CONTEXT_LINES_COUNT.
    num_context_lines: int = 1
    max_file_match_window: int = 0
    max_file_match_results: int = 0
    #: GitLab's ZOEKT_COUNT_LIMIT.
    max_line_match_window: int = 5000
    max_line_match_results: int = 5000
    #: 50 chunks of 10 lines.
    max_line_match_results_per_file: int = 500
    #: Sent only when above 0.
    file_match_offset: int = 0
    #: The proxy node, when the caller chooses it (GitLab's explicit node option).
    node_id: int | None = None


class SearchRequestRejected(ValueError):
    """A request that cannot be built as asked: ``errors`` names each field."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(errors)
        self.errors = errors


def query_node(query: str | Mapping[str, Any]) -> dict[str, Any]:
    """The caller's query AST node; a plain string is a ``query_string`` node."""
    if isinstance(query, str):
        return {"query_string": {"query": query}}
    return dict(query)


def repo_filter(project_ids: list[int]) -> dict[str, Any]:
    """GitLab's filter for these projects: ``repo_ids``, or the ``meta`` project_id
    regex when an id is above what a Zoekt repository id holds."""
    if any(pid > MAX_REPO_ID for pid in project_ids):
        value = "^(" + "|".join(str(pid) for pid in project_ids) + ")$"
        return {"meta": {"key": "project_id", "value": value}}
    return {"repo_ids": list(project_ids)}


def request_body(
    query: dict[str, Any], entries: list[tuple[str, list[int]]], options: SearchOptions
) -> dict[str, Any]:
    """GitLab's v2 body for ``(endpoint, project ids)`` entries, key for key."""
    body: dict[str, Any] = {
        "version": 2,
        "timeout": options.timeout,
        "num_context_lines": options.num_context_lines,
        "max_file_match_window": options.max_file_match_window,
        "max_file_match_results": options.max_file_match_results,
        "max_line_match_window": options.max_line_match_window,
        "max_line_match_results": options.max_line_match_results,
        "max_line_match_results_per_file": options.max_line_match_results_per_file,
        "forward_to": [
            {
                "query": {"and": {"children": [query, repo_filter(ids)]}},
                "endpoint": endpoint,
            }
            for endpoint, ids in entries
        ],
    }
    if options.file_match_offset > 0:
        body["file_match_offset"] = options.file_match_offset
    return body


def search_request(
    root_namespace_id: int,
    query: str | Mapping[str, Any],
    project_ids: Iterable[int],
    options: SearchOptions | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The request GitLab's proxy takes for ``query`` over ``project_ids`` of the
    namespace, with its proxy, and the requested projects no index serves (see the
    module). Raises ``SearchRequestRejected`` over 30,000 projects or for a proxy
    node that is not one of the entries' nodes."""
    options = options or SearchOptions()
    ids = sorted(set(project_ids))
    if len(ids) > MAX_TARGET_PROJECTS:
        raise SearchRequestRejected({"project_ids": [too_many(len(ids))]})
    answer = search_targets(root_namespace_id, now)
    out: dict[str, Any] = {
        "namespace_id": root_namespace_id,
        "search_enabled": False,
        "reason": None if answer.reason is None else str(answer.reason),
        "proxy": None,
        "request": None,
        "unrouted_project_ids": ids,
    }
    if not answer.targets:
        return out
    served = served_projects(answer, ids)
    # One entry per node (in node id order), for the nodes serving a requested project.
    targets = list({t.node_id: t for t in answer.targets if served[t.node_id]}.values())
    if not targets:
        out["reason"] = str(Reason.NO_REQUESTED_PROJECT_SERVED)
        return out
    if options.node_id is not None:
        proxy = next((t for t in targets if t.node_id == options.node_id), None)
        if proxy is None:
            raise SearchRequestRejected(
                {"options.node_id": [f"Node {options.node_id} serves none of these projects."]}
            )
    else:
        proxy = max(targets, key=lambda t: (len(served[t.node_id]), -t.node_id))
    routed = {pid for t in targets for pid in served[t.node_id]}
    out.update(
        search_enabled=True,
        reason=None,
        proxy={
            "node_id": proxy.node_id,
            "node_name": proxy.node_name,
            "search_base_url": proxy.search_base_url,
            "url": proxy_url(proxy.search_base_url),
        },
        request=request_body(
            query_node(query),
            [(t.search_base_url, served[t.node_id]) for t in targets],
            options,
        ),
        unrouted_project_ids=[pid for pid in ids if pid not in routed],
    )
    return out


def too_many(count: int) -> str:
    return (
        f"Ensure this field has no more than {MAX_TARGET_PROJECTS:,} projects "
        f"(GitLab's RoutingService limit); got {count:,}."
    )
