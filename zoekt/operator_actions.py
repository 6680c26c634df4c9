"""State changes behind the operator API: GitLab's admin endpoints and the catalog feed.

Every write of ``api/operator_views.py`` is one ``do_*`` call here. A call
that cannot proceed raises ``ObjectNotFound`` (GitLab's 404s) or
``Rejected`` (a 400 naming the field at fault); neither writes anything.

The catalog bulk upsert (``do_bulk_upsert_catalog``) is how a GitLab-like
source of truth feeds namespaces, projects and project statistics in. It
validates every row against the batch and the database together, under one
transaction-scoped advisory lock (so two batches never interleave), and then
writes everything with a fixed number of bulk statements, whatever the
number of rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from celery.utils import uuid as celery_uuid
from django.conf import settings as django_settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, Q, Subquery

from zoekt import clock, hooks
from zoekt.locks import LockKey, advisory_xact_lock
from zoekt.logging import get_logger
from zoekt.models import (
    EnabledNamespace,
    ForkNetworkMember,
    Index,
    Namespace,
    NamespaceRootStorageStatistics,
    Node,
    Project,
    ProjectFeature,
    ProjectStatistics,
    Replica,
    Repository,
)

log = get_logger(__name__)


class OperatorError(Exception):
    """A request that cannot be carried out; nothing was written."""


class ObjectNotFound(OperatorError):
    """GitLab answers 404: ``field`` names the path parameter at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


class Rejected(OperatorError):
    """A 400: ``errors`` maps each field (``projects[3].namespace_id``) to its messages."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(next(iter(errors.items())))
        self.errors = errors


# ----------------------------------------------------------------------------
# Lookups shared by the admin endpoints
# ----------------------------------------------------------------------------


def find_node(node_id: int, field: str = "node_id") -> Node:
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        raise ObjectNotFound(field, f"Zoekt node {node_id} not found.")
    return node


def find_namespace(ref: int | str, field: str = "namespace_id") -> Namespace:
    """A namespace by id, or (as GitLab's ``find_namespace!``) by its full path."""
    text = str(ref).strip()
    namespace = None
    if text.isdigit():
        namespace = Namespace.objects.filter(pk=int(text)).first()
    elif text:
        namespace = _namespace_by_full_path(text)
    if namespace is None:
        raise ObjectNotFound(field, f"Namespace {text} not found.")
    return namespace


def _namespace_by_full_path(full_path: str) -> Namespace | None:
    """Walk ``group/subgroup`` down from a root; paths compare case-insensitively."""
    segments = [s for s in full_path.strip("/").split("/") if s]
    if not segments:
        return None
    match = Q()
    for segment in set(segments):
        match |= Q(path__iexact=segment)
    candidates = list(
        Namespace.objects.filter(match).exclude(type=Namespace.Type.PROJECT).order_by("id")
    )
    parent_id = None
    found = None
    for segment in segments:
        found = next(
            (
                n
                for n in candidates
                if n.parent_id == parent_id and n.path.lower() == segment.lower()
            ),
            None,
        )
        if found is None:
            return None
        parent_id = found.id
    return found


# ----------------------------------------------------------------------------
# GitLab's admin endpoints (reference 3.5)
# ----------------------------------------------------------------------------


def do_enqueue_project_index(project_id: int) -> str:
    """Queue an ``index_repo`` for the project after commit; returns the Celery job id."""
    if not Project.objects.filter(pk=project_id).exists():
        raise ObjectNotFound("project_id", f"Project {project_id} not found.")
    job_id = celery_uuid()
    hooks.index_project_on_commit(project_id, job_id)
    return job_id


def do_update_number_of_replicas_override(
    namespace_ref: int | str, changes: dict
) -> EnabledNamespace:
    """Set or clear ``number_of_replicas_override`` on the root's enabled namespace.

    ``changes`` holds ``number_of_replicas_override`` (an int ≥ 1 or None) or
    nothing, in which case nothing changes (GitLab accepts an empty update).
    """
    namespace = find_namespace(namespace_ref, field="id")
    root_id = namespace.root_id
    with transaction.atomic():
        enabled = (
            EnabledNamespace.objects.select_for_update().filter(root_namespace_id=root_id).first()
        )
        if enabled is None:
            raise ObjectNotFound(
                "id",
                f"Zoekt::EnabledNamespace not found: root namespace {root_id} is not enabled.",
            )
        if "number_of_replicas_override" in changes:
            enabled.number_of_replicas_override = changes["number_of_replicas_override"]
            enabled.save(update_fields=["number_of_replicas_override"])
    return enabled


@dataclasses.dataclass(frozen=True)
class EnableResult:
    enabled_namespace: EnabledNamespace
    zoekt_node_id: int | None
    enabled_namespace_created: bool
    index_id: int | None = None
    index_created: bool = False


def do_enable_namespace(node_id: int, namespace_id: int, search: bool | None) -> EnableResult:
    """GitLab's ``PUT .../shards/:node_id/indexed_namespaces/:namespace_id``.

    Finds or creates the enabled namespace of a root namespace and sets
    ``search`` when given. With ``node_id`` > 0 it also finds or creates that
    node's index of the namespace, directly in state ``ready`` and attached to
    the namespace's first replica (created when missing). That index bypasses
    the planner: no reservation check, no project range, no repositories; its
    projects are indexed as they are pushed or as an operator asks.
    """
    node = find_node(node_id) if node_id > 0 else None
    namespace = find_namespace(namespace_id)
    if namespace.parent_id is not None:
        raise Rejected(
            {
                "namespace_id": [
                    f"Namespace {namespace.id} is not a root namespace; "
                    f"enable its root {namespace.root_id} instead."
                ]
            }
        )
    with transaction.atomic():
        enabled, created = EnabledNamespace.objects.get_or_create(root_namespace=namespace)
        # Serialise concurrent requests for the same namespace (replica creation).
        enabled = EnabledNamespace.objects.select_for_update().get(pk=enabled.pk)
        if search is not None and enabled.search != search:
            enabled.search = search
            enabled.save(update_fields=["search"])
        if node is None:
            return EnableResult(enabled, None, created)
        index = Index.objects.filter(zoekt_enabled_namespace=enabled, zoekt_node=node).first()
        index_created = False
        if index is None:
            replica = enabled.replicas.order_by("id").first()
            if replica is None:
                replica = Replica.objects.create(
                    zoekt_enabled_namespace=enabled, namespace_id=namespace.id
                )
            index = Index.objects.create(
                zoekt_enabled_namespace=enabled,
                zoekt_node=node,
                zoekt_replica=replica,
                namespace_id=namespace.id,
                state=Index.State.READY,
            )
            index_created = True
    return EnableResult(enabled, node.id, created, index.id, index_created)


def do_disable_namespace(node_id: int, namespace_id: int) -> dict:
    """GitLab's ``DELETE .../shards/:node_id/indexed_namespaces/:namespace_id``.

    Removes the namespace's indices (on that node, or on every node when
    ``node_id`` is 0), then destroys the enabled namespace (its replicas go
    with it). A namespace that is not enabled is not an error.

    GitLab destroys the index rows. Here ``zoekt_repositories`` refuses that
    (ON DELETE RESTRICT), and for good reason: a node still holds the data of
    every repository row. So an index without repository rows is deleted at
    once, and an index with some is detached from its namespace and replica
    and marked ``pending_deletion``: the deletion pipeline (reference 6.9)
    then sends the nodes ``delete_repo`` tasks and removes the index once
    its last repository is gone. Indices on other nodes (``node_id`` > 0)
    lose their enabled namespace and replica with it, so the orphan check
    sends them down the same path, as in GitLab.
    """
    node = find_node(node_id) if node_id > 0 else None
    namespace = find_namespace(namespace_id)
    now = clock.now()
    with transaction.atomic():
        enabled = (
            EnabledNamespace.objects.select_for_update().filter(root_namespace=namespace).first()
        )
        if enabled is None:
            return {"namespace_id": namespace.id, "enabled_namespace_id": None}
        indices = Index.objects.filter(zoekt_enabled_namespace=enabled)
        if node is not None:
            indices = indices.filter(zoekt_node=node)
        has_repositories = Exists(Repository.objects.filter(zoekt_index=OuterRef("pk")))
        marked = indices.filter(has_repositories).update(
            zoekt_enabled_namespace=None,
            zoekt_replica=None,
            state=Index.State.PENDING_DELETION,
            updated_at=now,
        )
        _, per_model = indices.exclude(has_repositories).delete()
        deleted = per_model.get(Index._meta.label, 0)
        enabled_id = enabled.id
        enabled.delete()
    return {
        "namespace_id": namespace.id,
        "enabled_namespace_id": enabled_id,
        "indices_deleted": deleted,
        "indices_pending_deletion": marked,
    }


# ----------------------------------------------------------------------------
# The catalog feed: bulk upsert of namespaces, projects and project statistics
# ----------------------------------------------------------------------------

# GitLab's Group::NUMBER_OF_ANCESTORS_ALLOWED: a group has at most 20 ancestors.
MAX_GROUP_ANCESTORS = 20

_TABLES = ("namespaces", "projects", "project_statistics")


@dataclasses.dataclass
class _Ns:
    """What validation needs of a namespace row already in the database."""

    parent_id: int | None
    type: str
    traversal_ids: list[int]


class _Cycle(Exception):
    def __init__(self, chain: list[int]):
        super().__init__(chain)
        self.chain = chain


def do_bulk_upsert_catalog(
    namespaces: list[dict], projects: list[dict], project_statistics: list[dict]
) -> dict:
    """Validate a whole batch against itself and the database, then upsert it.

    On any bad row ``Rejected`` names every bad row and field and nothing is
    written. Otherwise one transaction writes the namespaces (``traversal_ids``
    computed root first, ending with the namespace's own id, and re-derived
    for database descendants of moved namespaces), the projects with their
    feature and fork rows, the statistics, and refreshes
    ``namespace_root_storage_statistics`` of every root the batch touched.
    """
    now = clock.now()
    try:
        with transaction.atomic():
            # One batch at a time: two interleaved batches could disagree on parents.
            advisory_xact_lock(LockKey.CATALOG_UPSERT)
            batch = _CatalogBatch(namespaces, projects, project_statistics)
            batch.validate()
            if batch.errors:
                raise Rejected(batch.error_dict())
            return batch.write(now)
    except IntegrityError as exc:
        # Validation holds the batch to every constraint; this is a backstop.
        log.error("catalog_bulk_upsert_integrity_error", error=str(exc))
        raise Rejected({"body": [f"The batch conflicts with the database: {exc}"]}) from exc


class _CatalogBatch:
    """One batch: its rows, the database rows it refers to, and its verdict."""

    def __init__(self, namespaces: list[dict], projects: list[dict], statistics: list[dict]):
        self.ns_rows = namespaces
        self.project_rows = projects
        self.stat_rows = statistics
        self.batch_ns = {row["id"]: row for row in namespaces}
        self.batch_projects = {row["id"]: row for row in projects}
        self._errors: list[tuple[int, int, str, str]] = []
        self.db_ns: dict[int, _Ns] = {}
        self.db_projects: dict[int, tuple[int, int | None]] = {}
        self.db_project_by_pn: dict[int, int] = {}
        self.db_stats: set[int] = set()
        self.traversal: dict[int, list[int]] = {}
        self.unresolvable: set[int] = set()

    # --- errors ---------------------------------------------------------------------------
    @property
    def errors(self) -> bool:
        return bool(self._errors)

    def error(self, table: str, row: int, field: str, message: str) -> None:
        self._errors.append((_TABLES.index(table), row, field, message))

    def error_dict(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for table, row, field, message in sorted(self._errors, key=lambda e: e[:3]):
            out.setdefault(f"{_TABLES[table]}[{row}].{field}", []).append(message)
        return out

    # --- loading --------------------------------------------------------------------------
    def _load(self) -> None:
        ns_ids = set(self.batch_ns)
        ns_ids |= {r["parent_id"] for r in self.ns_rows if r["parent_id"] is not None}
        ns_ids |= {r["namespace_id"] for r in self.project_rows}
        ns_ids |= {r["project_namespace_id"] for r in self.project_rows}
        if ns_ids:
            for nid, parent_id, ns_type, traversal in Namespace.objects.filter(
                id__in=ns_ids
            ).values_list("id", "parent_id", "type", "traversal_ids"):
                self.db_ns[nid] = _Ns(parent_id, ns_type, list(traversal or []))
        project_ids = set(self.batch_projects)
        project_ids |= {
            r["forked_from_project_id"]
            for r in self.project_rows
            if r["forked_from_project_id"] is not None
        }
        project_ids |= {r["project_id"] for r in self.stat_rows}
        pn_ids = {r["project_namespace_id"] for r in self.project_rows}
        pn_ids |= {nid for nid, r in self.batch_ns.items() if r["type"] == Namespace.Type.PROJECT}
        if project_ids or pn_ids:
            rows = Project.objects.filter(
                Q(id__in=project_ids) | Q(project_namespace_id__in=pn_ids)
            ).values_list(
                "id",
                "namespace_id",
                "project_namespace_id",
                "namespace__parent_id",
                "namespace__type",
                "namespace__traversal_ids",
            )
            for pid, ns_id, pn_id, ns_parent, ns_type, ns_traversal in rows:
                self.db_projects[pid] = (ns_id, pn_id)
                if pn_id is not None:
                    self.db_project_by_pn[pn_id] = pid
                self.db_ns.setdefault(ns_id, _Ns(ns_parent, ns_type, list(ns_traversal or [])))
        if self.stat_rows:
            self.db_stats = set(
                ProjectStatistics.objects.filter(
                    project_id__in={r["project_id"] for r in self.stat_rows}
                ).values_list("project_id", flat=True)
            )

    # --- what a namespace is after the batch ---------------------------------------------
    def ns_exists(self, nid: int) -> bool:
        return nid in self.batch_ns or nid in self.db_ns

    def ns_type(self, nid: int) -> str:
        return self.batch_ns[nid]["type"] if nid in self.batch_ns else self.db_ns[nid].type

    def ns_parent(self, nid: int) -> int | None:
        if nid in self.batch_ns:
            return self.batch_ns[nid]["parent_id"]
        return self.db_ns[nid].parent_id

    def project_namespace_after(self, pid: int) -> int:
        if pid in self.batch_projects:
            return self.batch_projects[pid]["namespace_id"]
        return self.db_projects[pid][0]

    def resolve(self, nid: int) -> list[int] | None:
        """``traversal_ids`` of a namespace after the batch; None when a parent is bad.

        Walks up from ``nid``: a batch row steps to its parent; a database row
        steps to its deepest ancestor that the batch rewrites (its own stored
        ancestry stands above that), or ends the walk. Raises ``_Cycle`` when
        the walk comes back to a namespace it has seen.
        """
        chain: list[tuple[int, list[int]]] = []
        seen: dict[int, int] = {}
        current: int | None = nid
        base: list[int] = []
        while current is not None:
            if current in self.traversal:
                base = self.traversal[current]
                break
            if current in self.unresolvable:
                return None
            if current in seen:
                raise _Cycle([c for c, _ in chain[seen[current] :]] + [current])
            seen[current] = len(chain)
            if current in self.batch_ns:
                suffix = [current]
                following = self.batch_ns[current]["parent_id"]
            else:
                stored = self.db_ns.get(current)
                if stored is None:
                    self.unresolvable.add(nid)
                    return None
                ancestry = stored.traversal_ids or [current]
                rewritten = [k for k, a in enumerate(ancestry[:-1]) if a in self.batch_ns]
                if rewritten:
                    k = rewritten[-1]
                    suffix, following = ancestry[k + 1 :], ancestry[k]
                else:
                    suffix, following = ancestry, None
            chain.append((current, suffix))
            current = following
        for node_id, suffix in reversed(chain):
            base = [*base, *suffix]
            self.traversal[node_id] = base
        return self.traversal[nid]

    def root_after(self, nid: int) -> int:
        traversal = self.resolve(nid)
        return traversal[0] if traversal else nid

    # --- validation -----------------------------------------------------------------------
    def validate(self) -> None:
        self._load()
        self._check_namespaces()
        self._resolve_namespaces()
        self._check_projects()
        self._check_statistics()

    def _check_namespaces(self) -> None:
        Type = Namespace.Type
        for i, row in enumerate(self.ns_rows):
            nid, parent, ns_type = row["id"], row["parent_id"], row["type"]
            bad_parent = False
            stored = self.db_ns.get(nid)
            if stored is not None and stored.type != ns_type:
                self.error(
                    "namespaces",
                    i,
                    "type",
                    f"Namespace {nid} is a {stored.type} namespace; its type cannot change.",
                )
            if ns_type == Type.USER and parent is not None:
                self.error(
                    "namespaces", i, "parent_id", "A User namespace is a root: parent_id is null."
                )
                bad_parent = True
            elif ns_type == Type.PROJECT and parent is None:
                self.error(
                    "namespaces",
                    i,
                    "parent_id",
                    "A Project namespace needs a parent: the namespace of its project.",
                )
                bad_parent = True
            elif parent is not None and not self.ns_exists(parent):
                self.error(
                    "namespaces",
                    i,
                    "parent_id",
                    f"Namespace {parent} is neither in this batch nor in the database.",
                )
                bad_parent = True
            elif parent is not None:
                parent_type = self.ns_type(parent)
                if parent_type == Type.PROJECT:
                    self.error(
                        "namespaces",
                        i,
                        "parent_id",
                        f"Namespace {parent} is a Project namespace and cannot be a parent.",
                    )
                    bad_parent = True
                elif ns_type == Type.GROUP and parent_type != Type.GROUP:
                    self.error(
                        "namespaces",
                        i,
                        "parent_id",
                        f"A Group's parent must be a Group; namespace {parent} is a "
                        f"{parent_type} namespace.",
                    )
                    bad_parent = True
            owner = self.db_project_by_pn.get(nid)
            if (
                not bad_parent
                and ns_type == Type.PROJECT
                and owner is not None
                and owner not in self.batch_projects
                and self.db_projects[owner][0] != parent
            ):
                self.error(
                    "namespaces",
                    i,
                    "parent_id",
                    f"Namespace {nid} is the project namespace of project {owner}, whose "
                    f"namespace is {self.db_projects[owner][0]}: send the project in the same "
                    f"batch to move it.",
                )
                bad_parent = True
            if bad_parent:
                self.unresolvable.add(nid)

    def _resolve_namespaces(self) -> None:
        for i, row in enumerate(self.ns_rows):
            nid = row["id"]
            if nid in self.unresolvable:
                continue
            try:
                traversal = self.resolve(nid)
            except _Cycle as cycle:
                chain = " → ".join(str(n) for n in cycle.chain)
                self.error("namespaces", i, "parent_id", f"The parent chain loops back: {chain}.")
                continue
            if traversal is None:
                if not self._errors:  # a backstop: every None has an error elsewhere
                    self.error("namespaces", i, "parent_id", "The ancestry cannot be resolved.")
                continue
            if row["type"] == Namespace.Type.GROUP and len(traversal) - 1 > MAX_GROUP_ANCESTORS:
                self.error(
                    "namespaces",
                    i,
                    "parent_id",
                    f"A group may have at most {MAX_GROUP_ANCESTORS} ancestors; this one would "
                    f"have {len(traversal) - 1}.",
                )

    def _check_projects(self) -> None:
        Type = Namespace.Type
        for j, row in enumerate(self.project_rows):
            pid, ns, pn = row["id"], row["namespace_id"], row["project_namespace_id"]
            if not self.ns_exists(ns):
                self.error(
                    "projects",
                    j,
                    "namespace_id",
                    f"Namespace {ns} is neither in this batch nor in the database.",
                )
            elif self.ns_type(ns) == Type.PROJECT:
                self.error(
                    "projects",
                    j,
                    "namespace_id",
                    f"Namespace {ns} is a Project namespace; a project belongs to a Group or "
                    f"User namespace.",
                )
            if not self.ns_exists(pn):
                self.error(
                    "projects",
                    j,
                    "project_namespace_id",
                    f"Namespace {pn} is neither in this batch nor in the database.",
                )
            elif self.ns_type(pn) != Type.PROJECT:
                self.error(
                    "projects",
                    j,
                    "project_namespace_id",
                    f"Namespace {pn} is a {self.ns_type(pn)} namespace, not a Project namespace.",
                )
            elif self.ns_parent(pn) != ns:
                self.error(
                    "projects",
                    j,
                    "project_namespace_id",
                    f"The parent of project namespace {pn} is {self.ns_parent(pn)}, not the "
                    f"project's namespace {ns}.",
                )
            holder = self.db_project_by_pn.get(pn)
            if holder is not None and holder != pid:
                self.error(
                    "projects",
                    j,
                    "project_namespace_id",
                    f"Namespace {pn} is already the project namespace of project {holder}.",
                )
            stored = self.db_projects.get(pid)
            if stored is not None and stored[1] is not None and stored[1] != pn:
                self.error(
                    "projects",
                    j,
                    "project_namespace_id",
                    f"Project {pid} has project namespace {stored[1]}; it cannot change.",
                )
            forked = row["forked_from_project_id"]
            if (
                forked is not None
                and forked not in self.batch_projects
                and forked not in self.db_projects
            ):
                self.error(
                    "projects",
                    j,
                    "forked_from_project_id",
                    f"Project {forked} is neither in this batch nor in the database.",
                )

    def _check_statistics(self) -> None:
        for k, row in enumerate(self.stat_rows):
            pid = row["project_id"]
            if pid not in self.batch_projects and pid not in self.db_projects:
                self.error(
                    "project_statistics",
                    k,
                    "project_id",
                    f"Project {pid} is neither in this batch nor in the database.",
                )

    # --- writing ---------------------------------------------------------------------------
    def write(self, now) -> dict:
        affected_roots: set[int] = set()
        result = {
            "namespaces": self._write_namespaces(now, affected_roots),
            "projects": self._write_projects(now, affected_roots),
            "project_statistics": self._write_statistics(now, affected_roots),
        }
        result["namespace_root_storage_statistics"] = {
            "refreshed": _refresh_root_storage_statistics(affected_roots, now)
        }
        return result

    def _write_namespaces(self, now, affected_roots: set[int]) -> dict:
        if not self.ns_rows:
            return {"created": 0, "updated": 0, "descendants_updated": 0}
        existing = [nid for nid in self.batch_ns if nid in self.db_ns]
        Namespace.objects.bulk_create(
            [
                Namespace(
                    id=row["id"],
                    name=row["name"],
                    path=row["path"],
                    type=row["type"],
                    parent_id=row["parent_id"],
                    traversal_ids=self.traversal[row["id"]],
                    visibility_level=row["visibility_level"],
                    archived=row["archived"],
                    created_at=now,
                    updated_at=now,
                )
                # Parents before children, should the rows ever go in several statements.
                for row in sorted(self.ns_rows, key=lambda r: len(self.traversal[r["id"]]))
            ],
            update_conflicts=True,
            unique_fields=["id"],
            update_fields=[
                "name",
                "path",
                "type",
                "parent",
                "traversal_ids",
                "visibility_level",
                "archived",
                "updated_at",
            ],
        )
        _advance_id_sequence("namespaces", max(self.batch_ns))
        for nid in self.batch_ns:
            affected_roots.add(self.traversal[nid][0])
        moved = []
        for nid in existing:
            old = self.db_ns[nid].traversal_ids or [nid]
            affected_roots.add(old[0])
            if old != self.traversal[nid]:
                moved.append(nid)
        descendants = self._retraverse_descendants(moved, now)
        # A namespace that gained a parent is no longer a root.
        NamespaceRootStorageStatistics.objects.filter(
            namespace_id__in=[
                nid for nid in existing if self.batch_ns[nid]["parent_id"] is not None
            ]
        ).delete()
        return {
            "created": len(self.batch_ns) - len(existing),
            "updated": len(existing),
            "descendants_updated": descendants,
        }

    def _retraverse_descendants(self, moved: list[int], now) -> int:
        """Rewrite ``traversal_ids`` of database rows below a namespace the batch moved."""
        if not moved:
            return 0
        rows = list(
            Namespace.objects.filter(traversal_ids__overlap=moved)
            .exclude(id__in=list(self.batch_ns))
            .values_list("id", "parent_id", "type", "traversal_ids")
        )
        ids, traversals = [], []
        for nid, parent_id, ns_type, traversal in rows:
            self.db_ns[nid] = _Ns(parent_id, ns_type, list(traversal or []))
            self.traversal.pop(nid, None)
        for nid, _parent_id, _type, traversal in rows:
            new = self.resolve(nid)
            if new is not None and new != list(traversal or []):
                ids.append(nid)
                traversals.append("{" + ",".join(str(a) for a in new) + "}")
        if ids:
            # One statement, linear in the rows (bulk_update's CASE is not).
            with connection.cursor() as cursor:
                cursor.execute(_RETRAVERSE_SQL, {"ids": ids, "traversals": traversals, "now": now})
        return len(ids)

    def _write_projects(self, now, affected_roots: set[int]) -> dict:
        if not self.project_rows:
            return {"created": 0, "updated": 0}
        existing = [pid for pid in self.batch_projects if pid in self.db_projects]
        Project.objects.bulk_create(
            [
                Project(
                    id=row["id"],
                    name=row["name"],
                    path=row["path"],
                    namespace_id=row["namespace_id"],
                    project_namespace_id=row["project_namespace_id"],
                    visibility_level=row["visibility_level"],
                    archived=row["archived"],
                    repository_storage=row["repository_storage"],
                    created_at=now,
                    updated_at=now,
                )
                for row in self.project_rows
            ],
            update_conflicts=True,
            unique_fields=["id"],
            update_fields=[
                "name",
                "path",
                "namespace",
                "project_namespace",
                "visibility_level",
                "archived",
                "repository_storage",
                "updated_at",
            ],
        )
        _advance_id_sequence("projects", max(self.batch_projects))
        ProjectFeature.objects.bulk_create(
            [
                ProjectFeature(
                    project_id=row["id"],
                    repository_access_level=row["repository_access_level"],
                    created_at=now,
                    updated_at=now,
                )
                for row in self.project_rows
            ],
            update_conflicts=True,
            unique_fields=["project"],
            update_fields=["repository_access_level", "updated_at"],
        )
        forks = [r for r in self.project_rows if r["forked_from_project_id"] is not None]
        if forks:
            ForkNetworkMember.objects.bulk_create(
                [
                    ForkNetworkMember(
                        project_id=r["id"], forked_from_project_id=r["forked_from_project_id"]
                    )
                    for r in forks
                ],
                update_conflicts=True,
                unique_fields=["project"],
                update_fields=["forked_from_project"],
            )
        not_forks = [r["id"] for r in self.project_rows if r["forked_from_project_id"] is None]
        if not_forks:
            ForkNetworkMember.objects.filter(
                project_id__in=not_forks, forked_from_project__isnull=False
            ).update(forked_from_project=None)
        moved = []
        for row in self.project_rows:
            affected_roots.add(self.root_after(row["namespace_id"]))
            stored = self.db_projects.get(row["id"])
            if stored is not None and stored[0] != row["namespace_id"]:
                moved.append(row["id"])
                old_traversal = self.db_ns[stored[0]].traversal_ids
                affected_roots.add(old_traversal[0] if old_traversal else stored[0])
        if moved:
            # Statistics name their project's namespace; follow the move.
            ProjectStatistics.objects.filter(project_id__in=moved).update(
                namespace_id=Subquery(
                    Project.objects.filter(pk=OuterRef("project_id")).values("namespace_id")[:1]
                ),
                updated_at=now,
            )
        return {"created": len(self.batch_projects) - len(existing), "updated": len(existing)}

    def _write_statistics(self, now, affected_roots: set[int]) -> dict:
        if not self.stat_rows:
            return {"created": 0, "updated": 0}
        objects = []
        for row in self.stat_rows:
            namespace_id = self.project_namespace_after(row["project_id"])
            affected_roots.add(self.root_after(namespace_id))
            objects.append(
                ProjectStatistics(
                    project_id=row["project_id"],
                    namespace_id=namespace_id,
                    repository_size=row["repository_size"],
                    storage_size=row["storage_size"],
                    updated_at=now,
                )
            )
        ProjectStatistics.objects.bulk_create(
            objects,
            update_conflicts=True,
            unique_fields=["project"],
            update_fields=["namespace_id", "repository_size", "storage_size", "updated_at"],
        )
        updated = sum(1 for row in self.stat_rows if row["project_id"] in self.db_stats)
        return {"created": len(self.stat_rows) - updated, "updated": updated}


_RETRAVERSE_SQL = """
UPDATE namespaces AS n
SET traversal_ids = v.traversal::bigint[], updated_at = %(now)s
FROM unnest(%(ids)s::bigint[], %(traversals)s::text[]) AS v(id, traversal)
WHERE n.id = v.id
"""

_ADVANCE_SEQUENCE_SQL = """
SELECT setval(s.seq, %(max_id)s)
FROM (SELECT pg_get_serial_sequence(%(table)s, 'id')::regclass AS seq) s
WHERE %(max_id)s > COALESCE(pg_sequence_last_value(s.seq), 0)
"""


def _advance_id_sequence(table: str, max_id: int) -> None:
    """Ids come from the source of truth; keep locally made rows from reusing them."""
    with connection.cursor() as cursor:
        cursor.execute(_ADVANCE_SEQUENCE_SQL, {"table": table, "max_id": max_id})


_REFRESH_ROOT_STATISTICS_SQL = """
INSERT INTO namespace_root_storage_statistics
    (namespace_id, repository_size, storage_size, updated_at)
SELECT root.id,
       COALESCE(SUM(ps.repository_size), 0),
       COALESCE(SUM(ps.storage_size), 0),
       %(now)s
FROM namespaces root
LEFT JOIN namespaces n
       ON n.traversal_ids >= ARRAY[root.id]::bigint[]
      AND n.traversal_ids < ARRAY[root.id + 1]::bigint[]
LEFT JOIN projects p ON p.namespace_id = n.id
LEFT JOIN project_statistics ps ON ps.project_id = p.id
WHERE root.id = ANY(%(roots)s) AND root.parent_id IS NULL
GROUP BY root.id
ON CONFLICT (namespace_id) DO UPDATE SET
    repository_size = EXCLUDED.repository_size,
    storage_size = EXCLUDED.storage_size,
    updated_at = EXCLUDED.updated_at
"""


def _refresh_root_storage_statistics(root_ids: Iterable[int], now) -> int:
    """Sum ``repository_size`` and ``storage_size`` of every project below each root."""
    roots = sorted(set(root_ids))
    if not roots:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(_REFRESH_ROOT_STATISTICS_SQL, {"now": now, "roots": roots})
        return cursor.rowcount


def known_repository_storages() -> list[str]:
    return sorted(getattr(django_settings, "ZOEKT_GITALY_STORAGES", {}) or {})
