"""A plan becomes rows: GitLab's ``ProvisioningService`` (reference 5.4), at the database edge.

Input: a plan in the contract's JSON shape (``Plan.to_dict()`` /
``planner.core.plan_dict``). Output: a ``ProvisioningResult`` listing what was
written and what was refused, as data.

Everything runs in **one transaction** (a savepoint when the caller already
holds one, as the rollout job does inside its advisory lock). As in GitLab,
provisioning is **atomic per replica**: a replica is written whole or not at
all, and one replica's failure costs no other replica anything.

1. **Lock.** The enabled namespaces the plan names are locked ``FOR NO KEY
   UPDATE`` and the nodes it places indices on ``FOR UPDATE``, each in id
   order, so two writers cannot deadlock on them. While the locks are held no
   heartbeat can change a node's usable bytes, no index can claim more of a
   node (``Index.update_storage_bytes_and_watermark_level`` locks the node
   first) and no enabled namespace can be deleted under us. Should either
   batch-wide statement raise (a malformed id in a hand-written plan, a row
   lock that cannot be had within ``lock_timeout``, any database error), the
   apply starts again from nothing written and looks each enabled namespace
   and each node up on its own, in the same order, each in its own savepoint.
   A lookup that raises then fails only what depends on it, as GitLab's
   per-namespace rescue does: an enabled namespace's plans are recorded as
   ``provisioning_failed`` errors with GitLab's ``{message,
   failed_namespace_id}`` (not stamped: the row could not be read) and left
   out of the steps below; a node's failure refuses the replicas placed on it.
2. **Re-check, with live numbers, per replica.** Each locked node's unclaimed
   storage is recomputed in SQL (usable minus every index's reservation, in
   any state). Then, per ``create`` namespace and replica in plan order,
   every planned index is checked against a ledger that starts from those
   live values and is debited by each accepted replica:

   * node gone or no longer a search node → ``node_not_found``;
   * node taken out of service since the plan (a shutdown record written
     under the same node lock: a restart, a drain, a drained node not
     returned; docs/operations.md) → ``node_shutting_down``, this product's
     own error type;
   * the namespace already has an index on that node (an existing replica,
     an evicted index not yet deleted, reference 10.5/10.6, or a replica
     accepted before it; the unique (enabled namespace, node) index would
     refuse it) → ``namespace_already_on_node``;
   * required bytes > the ledger's unclaimed bytes → ``node_capacity_exceeded``.

   A refusal refuses that replica only; the namespace's other replicas are
   still checked and written. Errors carry the node's id and name.
3. **Write.** The accepted replicas are inserted in chunks of namespaces: one
   ``bulk_create`` for the chunk's replicas (state pending) and one for their
   indices (state pending, ``reserved_storage_bytes`` = required bytes,
   ``metadata`` = the project-namespace range with null ends removed), inside
   a savepoint. Should the chunk fail (something the checks did not foresee,
   such as a conflicting row, or any unexpected error), its savepoint is
   rolled back and its replicas are written one by one, each in its own
   savepoint (nested ``transaction.atomic``), so only the offending replica
   is left out (``namespace_already_on_node`` or ``provisioning_failed``) and
   nothing is half-written.
4. **Stamp, per namespace, after its replicas.** A namespace of which at
   least one replica was written has ``last_rollout_failed_at`` cleared; one
   of which nothing could be written (every replica refused or failed, or
   its re-check raised an unexpected error) and the plan failures get
   ``last_rollout_failed_at`` = ``clock.now()`` and
   ``metadata.rollout_required_storage_bytes`` (one statement).
5. **Destroy.** The replicas listed by ``destroy`` plans are deleted in one
   statement, each only if it belongs to that namespace; their indices are
   detached by the ``ON DELETE SET NULL`` foreign key and orphaned later. A
   destroy whose enabled namespace no longer exists is a
   ``missing_enabled_namespace`` error; one that removes nothing adds no
   success entry. Should the statement fail, each namespace's destroy is run
   in its own savepoint and only the failing one is reported.

An unexpected error while provisioning one namespace is caught, logged and
recorded as ``provisioning_failed``; the rest of the batch goes on.

The number of statements depends on the number of namespaces (one chunk of
``CHUNK_SIZE`` at a time), never on the number of projects.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction

from zoekt import clock
from zoekt.logging import get_logger
from zoekt.models import EnabledNamespace, Index, Node, Replica
from zoekt.reasons import Reason

log = get_logger(__name__)

#: Namespaces written per pair of bulk inserts.
CHUNK_SIZE = 500

_UNIQUE_NAMESPACE_NODE = "index_zoekt_indices_on_enabled_namespace_id_and_node_id"
#: PostgreSQL's detail of a unique violation: ``Key (a, b)=(1, 2) already exists.``
_UNIQUE_DETAIL = re.compile(r"\)=\(\s*(\d+)\s*,\s*(\d+)\s*\)")

#: ``progress(namespaces_done, namespaces_total)``
Progress = Callable[[int, int], None]

_DESTROY_SQL = """
DELETE FROM zoekt_replicas r
USING unnest(%s::bigint[], %s::bigint[]) AS d(replica_id, enabled_namespace_id)
WHERE r.id = d.replica_id AND r.zoekt_enabled_namespace_id = d.enabled_namespace_id
RETURNING r.zoekt_enabled_namespace_id
"""


@dataclass(slots=True)
class ProvisioningResult:
    """What the apply wrote and what it refused (GitLab's success/error entries, plus a type)."""

    #: ``{namespace_id, replica_id}`` per replica created, then
    #: ``{namespace_id, replicas_destroyed}`` per destroy that removed something.
    successes: list[dict[str, Any]] = field(default_factory=list)
    #: ``{type, message, failed_namespace_id, node_id, node_name, replica_idx}``.
    errors: list[dict[str, Any]] = field(default_factory=list)
    #: Root namespace ids stamped ``last_rollout_failed_at``: plan failures and
    #: namespaces of which nothing could be written.
    failed_namespace_ids: list[int] = field(default_factory=list)

    @property
    def created_namespace_ids(self) -> list[int]:
        return sorted({s["namespace_id"] for s in self.successes if "replica_id" in s})

    def as_dict(self) -> dict[str, Any]:
        return {
            "successes": list(self.successes),
            "errors": list(self.errors),
            "failed_namespace_ids": list(self.failed_namespace_ids),
        }


@dataclass(slots=True)
class _LiveNode:
    for_search: bool
    unclaimed_storage_bytes: int
    #: An operator is taking it out of service (``NodeQuerySet.in_shutdown``).
    shutting_down: bool = False


@dataclass(slots=True)
class _Accepted:
    """A namespace's replicas that passed the re-check: ``(replica_idx, replica plan)``."""

    ns_plan: Mapping[str, Any]
    replicas: list[tuple[int, Mapping[str, Any]]]


class ProvisioningService:
    def __init__(
        self,
        plan: Mapping[str, Any],
        *,
        now: datetime | None = None,
        progress: Progress | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        self.plan = plan
        self.now = now or clock.now()
        self.progress = progress
        self.chunk_size = chunk_size
        self.result = ProvisioningResult()
        #: Node id -> name: the live row's metadata ``name``, else the plan's.
        self.node_names: dict[int, str] = {}
        #: A node whose one-by-one lookup raised (by ``_order`` of its id) -> the error.
        self.node_lookup_errors: dict[tuple, str] = {}

    def execute(self) -> ProvisioningResult:
        try:
            with transaction.atomic():
                return self._execute(one_by_one=False)
        except _BatchLookupFailed:
            # Nothing was written before the locks: start again, one lookup at a time.
            self.result = ProvisioningResult()
            self.node_names = {}
            self.node_lookup_errors = {}
        with transaction.atomic():
            return self._execute(one_by_one=True)

    def _execute(self, *, one_by_one: bool) -> ProvisioningResult:
        creates = list(self.plan.get("create", ()))
        failures = list(self.plan.get("failures", ()))
        destroys = list(self.plan.get("destroy", ()))
        enabled, unread = self._lock_enabled_namespaces(
            [*creates, *failures, *destroys], one_by_one=one_by_one
        )
        if unread:  # their lookup failed: recorded, and left out of everything below
            creates, failures, destroys = (
                [ns_plan for ns_plan in plans if id(ns_plan) not in unread]
                for plans in (creates, failures, destroys)
            )
        self._names_from_plan(creates)
        live = self._lock_nodes(creates, one_by_one=one_by_one)
        taken = self._existing_placements(creates)
        failed: dict[int, int] = {}  # enabled namespace id -> required bytes
        for ns_plan in failures:
            if self._enabled_for(ns_plan, enabled) is not None:
                failed[ns_plan["enabled_namespace_id"]] = _required(ns_plan)
        accepted: list[_Accepted] = []
        for ns_plan in creates:
            if self._enabled_for(ns_plan, enabled) is None:
                self._missing(ns_plan)
                continue
            try:
                replicas = self._check(ns_plan, live, taken)
            except Exception as exc:  # one namespace's surprise never stops the batch
                self._unexpected(exc, ns_plan)
                failed[ns_plan["enabled_namespace_id"]] = _required(ns_plan)
                continue
            if replicas:
                accepted.append(_Accepted(ns_plan, replicas))
            elif ns_plan.get("replicas"):
                failed[ns_plan["enabled_namespace_id"]] = _required(ns_plan)
        done = len(creates) - len(accepted)
        written: Counter[int] = Counter()
        for start in range(0, len(accepted), self.chunk_size):
            chunk = accepted[start : start + self.chunk_size]
            written.update(self._write(chunk))
            done += len(chunk)
            if self.progress is not None:
                self.progress(done, len(creates))
        for item in accepted:
            if not written[item.ns_plan["enabled_namespace_id"]]:
                failed[item.ns_plan["enabled_namespace_id"]] = _required(item.ns_plan)
        self._stamp(enabled, failed)
        self._destroy(destroys, enabled)
        return self.result

    # ------------------------------------------------------------------ #
    # Locks, names and live numbers

    def _lock_enabled_namespaces(
        self, plans: list[Mapping[str, Any]], *, one_by_one: bool
    ) -> tuple[dict[int, EnabledNamespace], set[int]]:
        """The plan's enabled namespaces, locked in id order, and the plans whose lookup failed.

        At first one statement locks them all; should it raise (a malformed id,
        a lock that cannot be had in time, any database error), the batch is
        started again with ``one_by_one`` and each enabled namespace is looked
        up and locked in its own savepoint, in the same order. A lookup that
        raises then fails the plans that name it only, as GitLab's
        ``{message, failed_namespace_id}``; the rest of the batch goes on. The
        second set holds the ``id()`` of those plans.
        """
        if not plans:
            return {}, set()
        if not one_by_one:
            try:
                return self._select_enabled(plans), set()
            except Exception as exc:
                raise _BatchLookupFailed from exc
        enabled: dict[int, EnabledNamespace] = {}
        unread: set[int] = set()
        for group in _grouped(plans, lambda ns_plan: ns_plan.get("enabled_namespace_id")):
            try:
                with transaction.atomic():  # a failed lookup costs nothing else
                    enabled.update(self._select_enabled(group))
            except Exception as exc:
                for ns_plan in group:
                    self._unexpected(exc, ns_plan)
                    unread.add(id(ns_plan))
        return enabled, unread

    @staticmethod
    def _select_enabled(plans: Iterable[Mapping[str, Any]]) -> dict[int, EnabledNamespace]:
        ids = sorted({ns_plan["enabled_namespace_id"] for ns_plan in plans})
        rows = (
            EnabledNamespace.objects.filter(id__in=ids)
            .select_for_update(no_key=True)
            .order_by("id")
        )
        return {row.id: row for row in rows}

    def _names_from_plan(self, creates: list[Mapping[str, Any]]) -> None:
        """The names the plan carries (``nodes[].name``, each index's ``node_name``)."""
        for node in self.plan.get("nodes") or ():
            if node.get("name"):
                self.node_names[node["id"]] = str(node["name"])
        for ns_plan in creates:
            for replica in ns_plan.get("replicas") or ():
                for index in replica.get("indices") or ():
                    if index.get("node_name"):
                        self.node_names[index["node_id"]] = str(index["node_name"])

    def _lock_nodes(
        self, creates: list[Mapping[str, Any]], *, one_by_one: bool
    ) -> dict[int, _LiveNode]:
        """The planned nodes, locked in id order, with their live unclaimed bytes.

        As the enabled namespaces: one statement, else (``one_by_one``) one
        savepoint per node, a node whose lookup raises being recorded in
        ``node_lookup_errors`` so that only the replicas placed on it fail.
        """
        ids = [
            index.get("node_id")
            for ns_plan in creates
            for replica in ns_plan.get("replicas") or ()
            for index in replica.get("indices") or ()
        ]
        ids = [node_id for node_id in ids if node_id is not None]
        if not ids:
            return {}
        if not one_by_one:
            try:
                return self._select_nodes(ids)
            except Exception as exc:
                raise _BatchLookupFailed from exc
        live: dict[int, _LiveNode] = {}
        for group in _grouped(ids, lambda node_id: node_id):
            node_id = group[0]
            try:
                with transaction.atomic():
                    live.update(self._select_nodes([node_id]))
            except Exception as exc:
                log.warning("provisioning_failed", node_id=repr(node_id), error=_describe(exc))
                self.node_lookup_errors[_order(node_id)] = _describe(exc)
        return live

    def _select_nodes(self, ids: Iterable[Any]) -> dict[int, _LiveNode]:
        rows = (
            Node.objects.filter(id__in=sorted(set(ids)))
            .with_unclaimed_storage_bytes()
            .annotate(shutting_down=Node.objects.shutdown_hold())
            .select_for_update(of=("self",))
            .order_by("id")
            .values_list(
                "id",
                "services",
                "annotated_unclaimed_storage_bytes",
                "metadata__name",
                "shutting_down",
            )
        )
        live = {}
        for node_id, services, unclaimed, name, shutting_down in rows:
            live[node_id] = _LiveNode(Node.Service.ZOEKT in services, unclaimed, shutting_down)
            if name:
                self.node_names[node_id] = str(name)
        return live

    def _existing_placements(self, creates: list[Mapping[str, Any]]) -> set[tuple[int, int]]:
        """(enabled namespace, node) pairs that already have an index row, any state."""
        ids = sorted({ns_plan["enabled_namespace_id"] for ns_plan in creates})
        if not ids:
            return set()
        return set(
            Index.objects.filter(zoekt_enabled_namespace_id__in=ids).values_list(
                "zoekt_enabled_namespace_id", "zoekt_node_id"
            )
        )

    @staticmethod
    def _enabled_for(
        ns_plan: Mapping[str, Any], enabled: Mapping[int, EnabledNamespace]
    ) -> EnabledNamespace | None:
        row = enabled.get(ns_plan["enabled_namespace_id"])
        if row is None or row.root_namespace_id != ns_plan["namespace_id"]:
            return None
        return row

    def _node(self, node_id: int, word: str = "Node") -> str:
        """``Node 7 (zoekt-a)``, or ``Node 7`` for a node without a name."""
        name = self.node_names.get(node_id)
        return f"{word} {node_id}" if name is None else f"{word} {node_id} ({name})"

    # ------------------------------------------------------------------ #
    # The re-check

    def _check(
        self,
        ns_plan: Mapping[str, Any],
        live: dict[int, _LiveNode],
        taken: set[tuple[int, int]],
    ) -> list[tuple[int, Mapping[str, Any]]]:
        """The namespace's replicas that still fit, each whole; debits the ledger for them.

        The ledger and ``taken`` change only once the whole namespace has been
        checked, so an error half-way leaves them as they were.
        """
        enabled_id = ns_plan["enabled_namespace_id"]
        ledger: dict[int, int] = {}  # this namespace's debits so far, by node
        used: set[int] = set()  # nodes of this namespace's accepted replicas
        accepted = []
        for replica_idx, replica in enumerate(ns_plan["replicas"]):
            replica_ledger = dict(ledger)
            replica_nodes: set[int] = set()
            refused = False
            for index in replica["indices"]:
                node_id = index["node_id"]
                required = int(index["required_storage_bytes"])
                lookup_error = self.node_lookup_errors.get(_order(node_id))
                node = None if lookup_error is not None else live.get(node_id)
                if lookup_error is not None:
                    self._error(
                        Reason.PROVISIONING_FAILED,
                        lookup_error,
                        ns_plan,
                        node_id=node_id,
                        replica_idx=replica_idx,
                    )
                elif node is None or not node.for_search:
                    self._error(
                        Reason.NODE_NOT_FOUND,
                        f"{self._node(node_id)} not found (deleted or no longer a search node)",
                        ns_plan,
                        node_id=node_id,
                        replica_idx=replica_idx,
                    )
                elif node.shutting_down:
                    self._error(
                        Reason.NODE_SHUTTING_DOWN,
                        f"{self._node(node_id)} is being taken out of service "
                        "(a restart, a drain, or drained and not returned; docs/operations.md)",
                        ns_plan,
                        node_id=node_id,
                        replica_idx=replica_idx,
                    )
                elif (enabled_id, node_id) in taken or node_id in used | replica_nodes:
                    self._error(
                        Reason.NAMESPACE_ALREADY_ON_NODE,
                        f"Namespace {ns_plan['namespace_id']} already has an index on "
                        f"{self._node(node_id, 'node')}",
                        ns_plan,
                        node_id=node_id,
                        replica_idx=replica_idx,
                    )
                else:
                    available = replica_ledger.get(node_id, node.unclaimed_storage_bytes)
                    if required <= available:
                        replica_ledger[node_id] = available - required
                        replica_nodes.add(node_id)
                        continue
                    self._error(
                        Reason.NODE_CAPACITY_EXCEEDED,
                        f"{self._node(node_id)} has {available} unclaimed bytes; the index "
                        f"needs {required}",
                        ns_plan,
                        node_id=node_id,
                        replica_idx=replica_idx,
                    )
                refused = True
                break  # as GitLab: the replica's first problem ends it
            if not refused:
                ledger = replica_ledger
                used |= replica_nodes
                accepted.append((replica_idx, replica))
        for node_id, unclaimed in ledger.items():
            live[node_id].unclaimed_storage_bytes = unclaimed
        taken.update((enabled_id, node_id) for node_id in used)
        return accepted

    # ------------------------------------------------------------------ #
    # Writing

    def _write(self, chunk: list[_Accepted]) -> Counter[int]:
        """Insert the chunk's replicas; returns the replicas written per enabled namespace."""
        items = [(item.ns_plan, idx, replica) for item in chunk for idx, replica in item.replicas]
        if len(items) > 1:
            try:
                with transaction.atomic():
                    successes = self._insert(items)
            except Exception:  # one replica at a time finds the culprit(s)
                pass
            else:
                self.result.successes.extend(successes)
                return Counter(ns_plan["enabled_namespace_id"] for ns_plan, _, _ in items)
        written: Counter[int] = Counter()
        for ns_plan, replica_idx, replica in items:
            try:
                with transaction.atomic():  # this replica, whole or not at all
                    successes = self._insert([(ns_plan, replica_idx, replica)])
            except Exception as exc:
                self._replica_failed(exc, ns_plan, replica_idx, replica)
            else:
                self.result.successes.extend(successes)
                written[ns_plan["enabled_namespace_id"]] += 1
        return written

    def _insert(
        self, items: list[tuple[Mapping[str, Any], int, Mapping[str, Any]]]
    ) -> list[dict[str, Any]]:
        replicas = [
            Replica(
                zoekt_enabled_namespace_id=ns_plan["enabled_namespace_id"],
                namespace_id=ns_plan["namespace_id"],
                state=Replica.State.PENDING,
                created_at=self.now,
                updated_at=self.now,
            )
            for ns_plan, _, _ in items
        ]
        Replica.objects.bulk_create(replicas)
        indices = [
            Index(
                zoekt_enabled_namespace_id=ns_plan["enabled_namespace_id"],
                zoekt_replica_id=replica.id,
                zoekt_node_id=index["node_id"],
                namespace_id=ns_plan["namespace_id"],
                state=Index.State.PENDING,
                reserved_storage_bytes=index["required_storage_bytes"],
                metadata=index_metadata(index["projects"]),
                created_at=self.now,
                updated_at=self.now,
            )
            for replica, (ns_plan, _, replica_plan) in zip(replicas, items, strict=True)
            for index in replica_plan["indices"]
        ]
        if indices:
            Index.objects.bulk_create(indices)
        return [
            {"namespace_id": ns_plan["namespace_id"], "replica_id": replica.id}
            for replica, (ns_plan, _, _) in zip(replicas, items, strict=True)
        ]

    def _replica_failed(
        self,
        exc: Exception,
        ns_plan: Mapping[str, Any],
        replica_idx: int,
        replica: Mapping[str, Any],
    ) -> None:
        reason = _database_reason(exc) if isinstance(exc, DatabaseError) else None
        node_ids = {index.get("node_id") for index in replica.get("indices") or ()}
        node_id = next(iter(node_ids)) if len(node_ids) == 1 else None
        if reason == Reason.NAMESPACE_ALREADY_ON_NODE:
            node_id = _conflicting_node(exc, ns_plan["enabled_namespace_id"]) or node_id
        if reason is None:
            reason, message = Reason.PROVISIONING_FAILED, _describe(exc)
            log.warning(
                "provisioning_failed",
                namespace_id=ns_plan["namespace_id"],
                replica_idx=replica_idx,
                error=message,
            )
        elif reason == Reason.NAMESPACE_ALREADY_ON_NODE and node_id is not None:
            message = (
                f"Namespace {ns_plan['namespace_id']} already has an index on "
                f"{self._node(node_id, 'node')}"
            )
        else:
            message = _one_line(exc)
        self._error(reason, message, ns_plan, node_id=node_id, replica_idx=replica_idx)

    # ------------------------------------------------------------------ #
    # Stamps and destroys

    def _stamp(self, enabled: Mapping[int, EnabledNamespace], failed: Mapping[int, int]) -> None:
        rows = []
        for enabled_id, required in failed.items():
            row = enabled[enabled_id]
            row.last_rollout_failed_at = self.now
            row.metadata = {**(row.metadata or {}), "rollout_required_storage_bytes": required}
            row.updated_at = self.now
            rows.append(row)
            self.result.failed_namespace_ids.append(row.root_namespace_id)
        if rows:
            EnabledNamespace.objects.bulk_update(
                rows, ["last_rollout_failed_at", "metadata", "updated_at"]
            )
        created_roots = set(self.result.created_namespace_ids)
        created = {
            enabled_id
            for enabled_id, row in enabled.items()
            if row.root_namespace_id in created_roots and enabled_id not in failed
        }
        if created:
            EnabledNamespace.objects.filter(
                id__in=sorted(created), last_rollout_failed_at__isnull=False
            ).update(last_rollout_failed_at=None, updated_at=self.now)

    def _destroy(
        self, destroys: list[Mapping[str, Any]], enabled: Mapping[int, EnabledNamespace]
    ) -> None:
        present = []
        for ns_plan in destroys:
            if self._enabled_for(ns_plan, enabled) is None:
                self._missing(ns_plan)
            elif ns_plan.get("replicas_to_destroy"):
                present.append(ns_plan)
        if not present:
            return
        failed: set[int] = set()
        try:
            with transaction.atomic():
                deleted = self._delete(present)
        except Exception:  # one namespace at a time finds the culprit(s)
            deleted = Counter()
            for ns_plan in present:
                try:
                    with transaction.atomic():
                        deleted.update(self._delete([ns_plan]))
                except Exception as exc:
                    failed.add(ns_plan["enabled_namespace_id"])
                    self._unexpected(exc, ns_plan)
        for ns_plan in present:
            count = deleted[ns_plan["enabled_namespace_id"]]
            if count and ns_plan["enabled_namespace_id"] not in failed:
                self.result.successes.append(
                    {"namespace_id": ns_plan["namespace_id"], "replicas_destroyed": count}
                )

    @staticmethod
    def _delete(destroys: list[Mapping[str, Any]]) -> Counter[int]:
        """Delete the listed replicas of their namespaces; the count per enabled namespace."""
        replica_ids: list[int] = []
        owner_ids: list[int] = []
        for ns_plan in destroys:
            for replica_id in ns_plan["replicas_to_destroy"]:
                replica_ids.append(replica_id)
                owner_ids.append(ns_plan["enabled_namespace_id"])
        with connection.cursor() as cursor:
            cursor.execute(_DESTROY_SQL, [replica_ids, owner_ids])
            return Counter(enabled_id for (enabled_id,) in cursor.fetchall())

    # ------------------------------------------------------------------ #

    def _missing(self, ns_plan: Mapping[str, Any]) -> None:
        self._error(
            Reason.MISSING_ENABLED_NAMESPACE,
            f"Enabled namespace {ns_plan['enabled_namespace_id']} for namespace "
            f"{ns_plan['namespace_id']} not found",
            ns_plan,
        )

    def _unexpected(self, exc: Exception, ns_plan: Mapping[str, Any]) -> None:
        message = _describe(exc)
        log.warning("provisioning_failed", namespace_id=ns_plan.get("namespace_id"), error=message)
        self._error(Reason.PROVISIONING_FAILED, message, ns_plan)

    def _error(
        self,
        reason: Reason,
        message: str,
        ns_plan: Mapping[str, Any],
        *,
        node_id: int | None = None,
        replica_idx: int | None = None,
    ) -> None:
        self.result.errors.append(
            {
                "type": str(reason),
                "message": message,
                "failed_namespace_id": ns_plan.get("namespace_id"),
                "node_id": node_id,
                "node_name": None if node_id is None else self.node_names.get(node_id),
                "replica_idx": replica_idx,
            }
        )


class _BatchLookupFailed(Exception):
    """The batch-wide lock statement raised; the apply starts again one lookup at a time."""


def _order(value: Any) -> tuple:
    """A sort key for ids as a plan may carry them: integers in order, anything else after."""
    if type(value) is int:
        return (0, value, "")
    return (1, 0, f"{type(value).__name__}:{value!r}")


def _grouped(items: Iterable[Any], key: Callable[[Any], Any]) -> list[list[Any]]:
    """``items`` grouped by ``key`` (an id), the groups in id order (``_order``)."""
    groups: dict[tuple, list[Any]] = {}
    for item in items:
        groups.setdefault(_order(key(item)), []).append(item)
    return [groups[order] for order in sorted(groups)]


def index_metadata(projects: Mapping[str, Any]) -> dict[str, int]:
    """The index's project-namespace range with open (null) ends left out (reference 10.17)."""
    return {
        key: projects[key]
        for key in ("project_namespace_id_from", "project_namespace_id_to")
        if projects.get(key) is not None
    }


def _required(ns_plan: Mapping[str, Any]) -> int:
    return int(ns_plan.get("namespace_required_storage_bytes") or 0)


def _database_reason(exc: DatabaseError) -> Reason:
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    if isinstance(exc, IntegrityError) and getattr(diag, "constraint_name", None) == (
        _UNIQUE_NAMESPACE_NODE
    ):
        return Reason.NAMESPACE_ALREADY_ON_NODE
    return Reason.PROVISIONING_FAILED


def _conflicting_node(exc: BaseException, enabled_namespace_id: int) -> int | None:
    """The node of a unique (enabled namespace, node) violation, from PostgreSQL's detail."""
    detail = getattr(getattr(exc.__cause__, "diag", None), "message_detail", None) or ""
    match = _UNIQUE_DETAIL.search(detail)
    if match is None or int(match.group(1)) != enabled_namespace_id:
        return None
    return int(match.group(2))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _describe(exc: BaseException) -> str:
    """``TypeError: ...``: an unexpected error, by class and message, on one line."""
    return f"{exc.__class__.__name__}: {_one_line(exc)}"
