"""The catalog's one write path: namespaces, projects and project statistics.

GitLab (or a GitLab-like source of truth) feeds its catalog in two ways, and
both come here: the bulk API (``POST /api/v1/catalog/bulk_upsert``, whose
serializer adds only the request's shape) and the GitLab sync
(``gitlab_sync``), which walks GitLab's REST API and receives its system hooks.

1. **Row checks** (``check_row``, ``batch_errors``, ``check_rows``): plain
   functions over plain dicts. Each row is held to its table's columns (JSON
   types: an id is an integer, a flag a boolean; ranges; GitLab's visibility and
   access levels; a configured repository storage; no unknown columns), then the
   batch to itself (no duplicates, no namespace its own parent, no project its
   own fork). Every bad row and field is named, as ``projects[3].namespace_id``,
   with the messages the bulk API answers.
2. **The upsert** (``do_bulk_upsert_catalog``): the batch against the database,
   under one transaction-scoped advisory lock (so two batches never
   interleave), then every write in a fixed number of bulk statements, whatever
   the number of rows.

3. **Removal** (``do_remove_catalog_objects``): projects and group or user
   namespaces deleted by id (what is below them goes by the database's
   ``ON DELETE`` rules), and the root storage statistics of every root that
   lost a project refreshed, in the same transaction, under the same lock.

``bulk_upsert`` runs both for a writer without HTTP. The rows' builders for
the demo, the replays and the tests are in ``zoekt.catalog_rows`` (no Django
needed there).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.conf import settings as django_settings
from django.db import IntegrityError, connection, transaction
from django.db.models import OuterRef, Q, Subquery

from zoekt import clock
from zoekt.capacity import MAX_BYTES
from zoekt.locks import LockKey, advisory_xact_lock
from zoekt.logging import get_logger
from zoekt.models import (
    ForkNetworkMember,
    Namespace,
    NamespaceRootStorageStatistics,
    Project,
    ProjectFeature,
    ProjectStatistics,
)
from zoekt.operator_actions import Rejected
from zoekt.operator_errors import RejectedByState

log = get_logger(__name__)

__all__ = [
    "MAX_GROUP_ANCESTORS",
    "Rejected",
    "RejectedByState",
    "batch_errors",
    "bulk_upsert",
    "check_row",
    "check_rows",
    "do_bulk_upsert_catalog",
    "do_remove_catalog_objects",
    "known_repository_storages",
]

# ----------------------------------------------------------------------------
# Row checks: plain functions over plain dicts
# ----------------------------------------------------------------------------

#: The largest id (PostgreSQL's bigint).
MAX_ID = 2**63 - 1
#: A name's or a path's longest length.
MAX_NAME_LENGTH = 255
#: GitLab's Gitlab::VisibilityLevel: 0 private, 10 internal, 20 public.
VISIBILITY_LEVELS = (0, 10, 20)

_MISSING = object()


class _Invalid(Exception):
    def __init__(self, *messages: str):
        super().__init__(*messages)
        self.messages = list(messages)


def _integer(*, minimum: int, maximum: int, null: bool = False) -> Callable[[Any], Any]:
    """A JSON integer (never a string, a float or a boolean) within [minimum, maximum]."""

    def check(value):
        if value is None and null:
            return None
        _present(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid("A valid integer is required.")
        if value > maximum:
            raise _Invalid(f"Ensure this value is less than or equal to {maximum}.")
        if value < minimum:
            raise _Invalid(f"Ensure this value is greater than or equal to {minimum}.")
        return value

    return check


def _boolean(value):
    """A JSON boolean (never ``"true"`` or ``1``)."""
    _present(value)
    if not isinstance(value, bool):
        raise _Invalid("Must be a valid boolean.")
    return value


def _string(value):
    """A JSON string, not blank, of at most MAX_NAME_LENGTH characters once trimmed."""
    if value == "" or (value is not _MISSING and str(value).strip() == ""):
        raise _Invalid("This field may not be blank.")
    _present(value)
    if not isinstance(value, str):
        raise _Invalid("Not a valid string.")
    value = value.strip()
    messages = []
    if len(value) > MAX_NAME_LENGTH:
        messages.append(f"Ensure this field has no more than {MAX_NAME_LENGTH} characters.")
    if "\x00" in value:
        messages.append("Null characters are not allowed.")
    surrogate = next((ch for ch in value if 0xD800 <= ord(ch) <= 0xDFFF), None)
    if surrogate is not None:
        messages.append(f"Surrogate characters are not allowed: U+{ord(surrogate):X}.")
    if messages:
        raise _Invalid(*messages)
    return value


def _choice(choices: Iterable, *, integers: bool = False) -> Callable[[Any], Any]:
    """One of ``choices``; with ``integers``, a JSON integer among them."""
    by_text = {str(choice): choice for choice in choices}

    def check(value):
        _present(value)
        if integers and (isinstance(value, bool) or not isinstance(value, int)):
            raise _Invalid(f'"{value}" is not a valid choice.')
        try:
            return by_text[str(value)]
        except KeyError:
            raise _Invalid(f'"{value}" is not a valid choice.') from None

    return check


def _present(value) -> None:
    if value is _MISSING:
        raise _Invalid("This field is required.")
    if value is None:
        raise _Invalid("This field may not be null.")


def _repository_storage(value):
    value = _string(value)
    known = known_repository_storages()
    if value not in known:
        raise _Invalid(
            f"Unknown repository storage {value!r}; configured: {', '.join(known)} "
            f"(ZOEKT_GITALY_STORAGES)."
        )
    return value


_id = _integer(minimum=1, maximum=MAX_ID)
_parent_id = _integer(minimum=1, maximum=MAX_ID, null=True)
_bytes = _integer(minimum=0, maximum=MAX_BYTES)
_visibility = _choice(VISIBILITY_LEVELS, integers=True)

#: Each table's columns, in the order their errors are named, and each one's check.
COLUMNS: dict[str, dict[str, Callable[[Any], Any]]] = {
    # GitLab's namespaces table.
    "namespaces": {
        "id": _id,
        "name": _string,
        "path": _string,
        "type": _choice(Namespace.Type.values),
        "parent_id": _parent_id,
        "visibility_level": _visibility,
        "archived": _boolean,
    },
    # GitLab's projects table with its feature and fork columns.
    "projects": {
        "id": _id,
        "name": _string,
        "path": _string,
        "namespace_id": _id,
        "project_namespace_id": _id,
        "visibility_level": _visibility,
        "archived": _boolean,
        "repository_storage": _repository_storage,
        "repository_access_level": _choice(ProjectFeature.AccessLevel.values, integers=True),
        "forked_from_project_id": _parent_id,
    },
    # GitLab's project_statistics table.
    "project_statistics": {
        "project_id": _id,
        "repository_size": _bytes,
        "storage_size": _bytes,
    },
}

_TABLES = tuple(COLUMNS)


def check_row(table: str, row: Mapping) -> tuple[dict, dict[str, list[str]]]:
    """One row held to its table's columns: ``(clean row, {})`` or ``({}, errors by column)``.

    Unknown columns are named alone; otherwise every bad column is. The clean row has
    every column, strings trimmed.
    """
    columns = COLUMNS[table]
    unknown = sorted(set(row) - set(columns))
    if unknown:
        return {}, {column: ["Unknown field."] for column in unknown}
    clean: dict = {}
    errors: dict[str, list[str]] = {}
    for column, check in columns.items():
        try:
            clean[column] = check(row.get(column, _MISSING))
        except _Invalid as exc:
            errors[column] = exc.messages
    return ({}, errors) if errors else (clean, {})


def batch_errors(
    namespaces: list[dict], projects: list[dict], project_statistics: list[dict]
) -> dict[str, list[str]]:
    """A batch of checked rows held to itself: duplicates, a namespace its own parent,
    a project its own fork. Errors by ``table[index].column``, in row order."""
    tables = {
        "namespaces": namespaces,
        "projects": projects,
        "project_statistics": project_statistics,
    }
    errors: dict[str, list[str]] = {}

    def duplicates(table: str, field: str, noun: str) -> None:
        rows = tables[table]
        counts = Counter(row[field] for row in rows)
        first: dict[int, int] = {}
        for i, row in enumerate(rows):
            value = row[field]
            if counts[value] < 2:
                continue
            if value not in first:
                first[value] = i
                continue
            errors.setdefault(f"{table}[{i}].{field}", []).append(
                f"Duplicate {noun} {value}: also in {table}[{first[value]}]."
            )

    duplicates("namespaces", "id", "namespace")
    duplicates("projects", "id", "project")
    duplicates("projects", "project_namespace_id", "project namespace")
    duplicates("project_statistics", "project_id", "project")
    for i, row in enumerate(namespaces):
        if row["parent_id"] == row["id"]:
            errors.setdefault(f"namespaces[{i}].parent_id", []).append(
                "A namespace cannot be its own parent."
            )
    for j, row in enumerate(projects):
        if row["forked_from_project_id"] == row["id"]:
            errors.setdefault(f"projects[{j}].forked_from_project_id", []).append(
                "A project cannot be forked from itself."
            )
    return dict(sorted(errors.items(), key=_row_order))


def _row_order(item: tuple[str, list[str]]) -> tuple[int, int, str]:
    key = item[0]
    table, _, rest = key.partition("[")
    index, _, field = rest.partition("].")
    return (_TABLES.index(table) if table in _TABLES else 9, int(index or 0), field)


def check_rows(
    namespaces: list[Mapping], projects: list[Mapping], project_statistics: list[Mapping]
) -> tuple[list[dict], list[dict], list[dict]]:
    """Every row, then the batch, checked: the clean rows, or ``Rejected`` naming each
    bad row and column (``projects[3].repository_storage``)."""
    clean: dict[str, list[dict]] = {}
    errors: dict[str, list[str]] = {}
    given = zip(_TABLES, (namespaces, projects, project_statistics), strict=True)
    for table, rows in given:
        clean[table] = []
        for i, row in enumerate(rows):
            checked, row_errors = check_row(table, row)
            clean[table].append(checked)
            for column, messages in row_errors.items():
                errors[f"{table}[{i}].{column}"] = messages
    if errors:
        raise Rejected(errors)
    tables = (clean["namespaces"], clean["projects"], clean["project_statistics"])
    errors = batch_errors(*tables)
    if errors:
        raise Rejected(errors)
    return tables


def bulk_upsert(
    namespaces: list[Mapping], projects: list[Mapping], project_statistics: list[Mapping]
) -> dict:
    """The bulk API's path without HTTP: every row checked (``check_rows``), then
    ``do_bulk_upsert_catalog``. ``Rejected`` names what is wrong; nothing is written."""
    return do_bulk_upsert_catalog(*check_rows(namespaces, projects, project_statistics))


def known_repository_storages() -> list[str]:
    """The repository storages a project may name (``ZOEKT_GITALY_STORAGES``), sorted."""
    return sorted(getattr(django_settings, "ZOEKT_GITALY_STORAGES", {}) or {})


# ----------------------------------------------------------------------------
# The upsert: the batch against the database, then bulk writes
# ----------------------------------------------------------------------------

# GitLab's Group::NUMBER_OF_ANCESTORS_ALLOWED: a group has at most 20 ancestors.
MAX_GROUP_ANCESTORS = 20


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

    On any bad row ``RejectedByState`` (a ``Rejected``: the API's 409) names every bad
    row and field and nothing is written. Otherwise one transaction writes the
    namespaces (``traversal_ids`` computed root first, ending with the namespace's own
    id, and re-derived for database descendants of moved namespaces), the projects with their
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
                # The batch against the stored catalog: well-formed rows that do not fit it.
                raise RejectedByState(batch.error_dict())
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


_REMOVE_PROJECTS_SQL = """
DELETE FROM projects p
USING namespaces n
WHERE p.id = ANY(%(ids)s::bigint[]) AND n.id = p.namespace_id
RETURNING p.project_namespace_id, n.traversal_ids[1]
"""

_REMOVE_NAMESPACES_SQL = """
DELETE FROM namespaces
WHERE id = ANY(%(ids)s::bigint[]) AND type IN ('Group', 'User')
RETURNING traversal_ids[1]
"""

_REMOVE_PROJECT_NAMESPACES_SQL = """
DELETE FROM namespaces n
WHERE n.id = ANY(%(ids)s::bigint[]) AND n.type = 'Project'
  AND NOT EXISTS (SELECT 1 FROM projects p WHERE p.project_namespace_id = n.id)
"""


def do_remove_catalog_objects(
    *, project_ids: Iterable[int] = (), namespace_ids: Iterable[int] = ()
) -> dict:
    """Remove projects and group or user namespaces that the source of truth no longer has.

    One transaction, under the catalog's lock: the projects are deleted with their project
    namespaces, then the namespaces (a Project namespace id among them is ignored: it goes
    with its project), and the database's ``ON DELETE`` rules do the rest (a namespace's
    subgroups and projects, the statistics, a deleted root's enabled namespace; a deleted
    project's repositories are orphaned for the deletion pipeline). Every remaining root
    that lost a project gets its ``namespace_root_storage_statistics`` recomputed before
    the transaction commits, so its totals are the sum of what it still holds. Ids that
    are not in the catalog are ignored. Returns the counts of what was deleted.
    """
    project_ids = sorted(set(project_ids))
    namespace_ids = sorted(set(namespace_ids))
    now = clock.now()
    with transaction.atomic():
        advisory_xact_lock(LockKey.CATALOG_UPSERT)
        roots: set[int] = set()
        removed_projects = removed_namespaces = removed_project_namespaces = 0
        with connection.cursor() as cursor:
            if project_ids:
                cursor.execute(_REMOVE_PROJECTS_SQL, {"ids": project_ids})
                gone = cursor.fetchall()
                removed_projects = len(gone)
                roots |= {root for _pn, root in gone if root is not None}
                project_namespaces = [pn for pn, _root in gone if pn is not None]
                if project_namespaces:
                    cursor.execute(_REMOVE_PROJECT_NAMESPACES_SQL, {"ids": project_namespaces})
                    removed_project_namespaces = cursor.rowcount
            if namespace_ids:
                cursor.execute(_REMOVE_NAMESPACES_SQL, {"ids": namespace_ids})
                gone_roots = cursor.fetchall()
                removed_namespaces = len(gone_roots)
                roots |= {root for (root,) in gone_roots if root is not None}
        # A root deleted itself is skipped (its totals went with it by cascade).
        refreshed = _refresh_root_storage_statistics(roots, now)
    return {
        "projects": removed_projects,
        "namespaces": removed_namespaces,
        "project_namespaces": removed_project_namespaces,
        "namespace_root_storage_statistics": {"refreshed": refreshed},
    }


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
