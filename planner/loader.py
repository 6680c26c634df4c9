"""The database as a scenario: a resource pool in, a ``plan-scenario`` dict out.

The scenario is exactly what ``python -m planner plan`` reads (the contract
in ``../shared/contracts/plan-scenario.md``), so a rollout's input can be
written to a file and replayed without a database.

* ``nodes``: the pool's candidate nodes in candidate order, each with its
  ``unclaimed_storage_bytes`` (computed in SQL by the selection), the
  ``process_health`` it last reported (only the webserver counters the
  planner reads; ``null`` when the node reported none) and its own
  ``memory_budget_bytes`` (source B, ``zoekt.memory.reported_memory_limit``:
  the webserver's reported ``memory_limit_bytes`` when its version passes
  the gate; ``null`` otherwise, and always ``null`` while the budget setting
  is unset, so the plan is then the disk-only plan). With memory planning on
  each node also carries ``reserved_memory_bytes``: the estimated memory of
  the ready and pre-ready indices it already holds (the repository bytes of
  the projects in their ranges × ``memory_ratio``), the memory counterpart
  of the reservations netted out of its unclaimed storage.
* ``namespaces``: the selected enabled namespaces in selection order, each
  with ``number_of_replicas`` (the override, else the default setting), its
  ``existing_replicas`` (``{id, state}`` with GitLab's state names, by id)
  and its ``projects``: every project whose project namespace lies under the
  root (``namespaces.traversal_ids[1]`` is the root id, type ``Project``),
  with ``repository_size`` from ``project_statistics`` or ``null`` when the
  project has no statistics row; and its ``existing_node_ids``: every node
  holding an index row of the enabled namespace, in any state and whether
  or not the index still belongs to a replica (orphaned, evicted), so the
  planner never plans a second index of the namespace on one of them
  (``zoekt_indices`` is unique on enabled namespace and node).
* a node with a zone carries its ``zone``, and then a namespace holding an
  index on a node that is not a candidate carries that node's zone in
  ``existing_zones`` (docs/planner.md, "Zones"); without zones neither key
  appears.
* each node carries its ``name`` (the ``name`` its metadata reports, else
  ``null``), which the plan copies onto every index and node entry.
* ``options``: ``buffer_factor`` is ``zoekt.buffer_factor.global_buffer_factor()``
  (an integer when integral, else the float as is: the core takes a float at
  its shortest decimal form and rounds each project's bytes up, and JSON
  round-trips that form exactly, so a replay plans the same bytes);
  ``max_indices_per_replica`` 10; ``strategy`` from ``zoekt_placement_strategy``
  (``balanced`` by default, ``first_fit`` for GitLab's choice), with
  ``order`` and ``max_index_storage_fraction`` from ``placement_options``
  (``largest_first`` and 0.25 for balanced; GitLab's ``given`` and none for
  first fit); each node carries ``total_bytes``, its disk size (what
  balanced scores its room against); ``memory``:
  ``node_memory_budget_bytes`` from the ``zoekt_node_memory_budget_bytes`` setting (``null``: memory
  planning off), ``memory_ratio`` from ``zoekt_memory_ratio`` and
  ``concurrency_factor`` the core's ``CONCURRENCY_FACTOR`` (a constant, not a
  setting).

Queries: one for the existing replicas, one for the nodes holding the
namespaces' indices, and one for the projects of every
selected root, read through a server-side cursor in chunks of
``chunk_size`` rows (one statement, ``FETCH`` round trips of ``chunk_size``
rows), plus the buffer factor's when its cache is cold, plus one for the
nodes' reserved memory when memory planning is on. The count does not
grow with the number of projects, nor with the number of namespaces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connection

from planner.core import CONCURRENCY_FACTOR
from planner.scenario import placement_options
from planner.selection import ResourcePool, SelectedNode
from zoekt import app_settings, capacity, memory
from zoekt.buffer_factor import global_buffer_factor
from zoekt.models import Index, Node, Replica

#: Rows fetched per round trip from the projects cursor.
DEFAULT_CHUNK_SIZE = 10_000

#: ``progress(namespaces_loaded, namespaces_total, projects_loaded)``
Progress = Callable[[int, int, int], None]

_REPLICA_STATE_NAMES = {state.value: state.label for state in Replica.State}

# Every project whose project namespace lies under one of the roots, by root
# then project namespace id. The range condition on traversal_ids is the
# prefix test "traversal_ids[1] = root" written so the btree index on
# traversal_ids can serve it; the explicit test is kept for clarity.
_PROJECTS_SQL = """
SELECT r.root_id, n.id, p.id, s.repository_size
FROM unnest(%s::bigint[]) AS r(root_id)
JOIN namespaces n
  ON n.traversal_ids >= ARRAY[r.root_id]
 AND n.traversal_ids < ARRAY[r.root_id + 1]
 AND n.traversal_ids[1] = r.root_id
 AND n.type = 'Project'
JOIN projects p ON p.project_namespace_id = n.id
LEFT JOIN project_statistics s ON s.project_id = p.id
ORDER BY r.root_id, n.id
"""


class ScenarioLoader:
    """Build the scenario dict for one resource pool; counts what it read."""

    def __init__(
        self,
        pool: ResourcePool,
        *,
        buffer_factor: int | float | None = None,
        max_indices_per_replica: int = capacity.MAX_INDICES_PER_REPLICA,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        progress: Progress | None = None,
        settings: app_settings.ZoektSettings | None = None,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.buffer_factor = buffer_factor
        self.max_indices_per_replica = max_indices_per_replica
        self.chunk_size = chunk_size
        self.progress = progress
        self.projects_loaded = 0
        self.fetches = 0

    def load(self) -> dict[str, Any]:
        factor = self.buffer_factor
        if factor is None:
            factor = global_buffer_factor()
        if isinstance(factor, float) and factor.is_integer():
            factor = int(factor)
        namespaces = [
            {
                "enabled_namespace_id": ns.enabled_namespace_id,
                "namespace_id": ns.namespace_id,
                "number_of_replicas": ns.number_of_replicas,
                "existing_replicas": [],
                "projects": [],
                "existing_node_ids": [],
            }
            for ns in self.pool.namespaces
        ]
        by_enabled = {ns["enabled_namespace_id"]: ns for ns in namespaces}
        by_root = {ns["namespace_id"]: ns for ns in namespaces}
        if namespaces:
            self._load_existing_replicas(by_enabled)
            self._load_existing_nodes(by_enabled)
            self._load_projects(by_root)
        settings = self.settings or app_settings.current()
        configured = settings.node_memory_budget_bytes
        ratio = _number(settings.memory_ratio)
        nodes = [node_entry(node, configured) for node in self.pool.nodes]
        if namespaces and any("zone" in entry for entry in nodes):
            self._load_existing_zones(namespaces, {entry["id"] for entry in nodes})
        if configured is not None and nodes:
            reserved = memory.estimated_memory_by_node([n["id"] for n in nodes], ratio)
            for entry in nodes:
                entry["reserved_memory_bytes"] = reserved.get(entry["id"], 0)
        return {
            "options": {
                "buffer_factor": factor,
                "max_indices_per_replica": self.max_indices_per_replica,
                "strategy": settings.placement_strategy,
                **placement_options(settings.placement_strategy),
                "memory": {
                    "node_memory_budget_bytes": configured,
                    "memory_ratio": ratio,
                    "concurrency_factor": CONCURRENCY_FACTOR,
                },
            },
            "nodes": nodes,
            "namespaces": namespaces,
        }

    def _load_existing_replicas(self, by_enabled: dict[int, dict[str, Any]]) -> None:
        rows = (
            Replica.objects.filter(zoekt_enabled_namespace_id__in=list(by_enabled))
            .order_by("zoekt_enabled_namespace_id", "id")
            .values_list("zoekt_enabled_namespace_id", "id", "state")
        )
        for enabled_id, replica_id, state in rows:
            by_enabled[enabled_id]["existing_replicas"].append(
                {"id": replica_id, "state": _REPLICA_STATE_NAMES[state]}
            )

    def _load_existing_nodes(self, by_enabled: dict[int, dict[str, Any]]) -> None:
        rows = (
            Index.objects.filter(zoekt_enabled_namespace_id__in=list(by_enabled))
            .order_by("zoekt_enabled_namespace_id", "zoekt_node_id")
            .values_list("zoekt_enabled_namespace_id", "zoekt_node_id")
            .distinct()
        )
        for enabled_id, node_id in rows:
            by_enabled[enabled_id]["existing_node_ids"].append(node_id)

    def _load_existing_zones(self, namespaces: list[dict[str, Any]], candidates: set[int]) -> None:
        """``existing_zones``: the zones of the nodes holding an index of a namespace
        that are not candidates (a candidate's zone is on its own entry); only when
        some candidate has a zone, and only on the namespaces that have any."""
        holders = {n for ns in namespaces for n in ns["existing_node_ids"]} - candidates
        if not holders:
            return
        zones = dict(
            Node.objects.filter(id__in=holders, zone__isnull=False).values_list("id", "zone")
        )
        for ns in namespaces:
            found = sorted({zones[n] for n in ns["existing_node_ids"] if n in zones})
            if found:
                ns["existing_zones"] = found

    def _load_projects(self, by_root: dict[int, dict[str, Any]]) -> None:
        total = len(by_root)
        done = 0
        current_root: int | None = None
        projects: list[dict[str, Any]] = []
        append = projects.append
        roots = sorted(by_root)
        # Rows come by root: when a root's first row arrives, every root before it is done.
        position = {root: i for i, root in enumerate(roots)}
        server_side = not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
        cursor = connection.chunked_cursor() if server_side else connection.cursor()
        with cursor:
            cursor.execute(_PROJECTS_SQL, [roots])
            while True:
                rows = cursor.fetchmany(self.chunk_size)
                self.fetches += 1
                if not rows:
                    break
                self.projects_loaded += len(rows)
                for root_id, pnid, project_id, size in rows:
                    if root_id != current_root:
                        current_root = root_id
                        done = position[root_id]
                        projects = by_root[root_id]["projects"]
                        append = projects.append
                    append(
                        {
                            "project_namespace_id": pnid,
                            "project_id": project_id,
                            "repository_size": size,
                        }
                    )
                if self.progress is not None:
                    self.progress(done, total, self.projects_loaded)
        if self.progress is not None:
            self.progress(total, total, self.projects_loaded)


def load_scenario(pool: ResourcePool, **options: Any) -> dict[str, Any]:
    """The scenario dict for ``pool`` (see ``ScenarioLoader`` for the options)."""
    return ScenarioLoader(pool, **options).load()


def node_entry(node: SelectedNode, node_memory_budget_bytes: int | None = None) -> dict[str, Any]:
    """A scenario node; its own memory budget (source B) only while the setting (A) is set."""
    own_budget = None
    if node_memory_budget_bytes is not None:
        own_budget = memory.reported_memory_limit(node.metadata)
    name = (node.metadata or {}).get("name")
    entry = {
        "id": node.id,
        "name": name if isinstance(name, str) else None,
        "unclaimed_storage_bytes": node.unclaimed_storage_bytes,
        "total_bytes": node.total_bytes,
        "memory_budget_bytes": own_budget,
        "process_health": process_health(node.metadata),
    }
    if node.zone is not None:
        # Only a node with a zone says so: without zones the scenario is GitLab's.
        entry["zone"] = node.zone
    return entry


def _number(value: int | float) -> int | float:
    """An integral float as an int (``1.0`` → ``1``), as the buffer factor is written."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def process_health(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The part of a node's reported ``process_health`` the planner reads, or None.

    Only ``webserver.rss_bytes`` and ``webserver.shards_loaded`` are kept; a
    value that is not a non-negative integer becomes null, so whatever a node
    reported, the scenario stays valid.
    """
    health = (metadata or {}).get("process_health")
    if not isinstance(health, dict):
        return None
    webserver = health.get("webserver")
    if not isinstance(webserver, dict):
        return {}
    return {
        "webserver": {key: _counter(webserver.get(key)) for key in ("rss_bytes", "shards_loaded")}
    }


def _counter(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None
