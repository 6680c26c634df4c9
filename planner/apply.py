"""A plan becomes rows: GitLab's ``ProvisioningService`` (reference 5.4), at the database edge.

Input: a plan in the contract's JSON shape (``Plan.to_dict()`` /
``planner.core.plan_dict``). Output: a ``ProvisioningResult`` listing what was
written and what was refused, as data.

Everything runs in **one transaction** (a savepoint when the caller already
holds one, as the rollout job does inside its advisory lock):

1. **Lock.** The enabled namespaces the plan names are locked ``FOR NO KEY
   UPDATE`` and the nodes it places indices on ``FOR UPDATE``, each in id
   order, so two writers cannot deadlock on them. While the locks are held no
   heartbeat can change a node's usable bytes, no index can claim more of a
   node (``Index.update_storage_bytes_and_watermark_level`` locks the node
   first) and no enabled namespace can be deleted under us.
2. **Re-check, with live numbers.** Each locked node's unclaimed storage is
   recomputed in SQL (usable minus every index's reservation, in any
   state). Then, per ``create`` namespace and in plan order, every planned
   index is checked against a ledger that starts from those live values and
   is debited by each accepted namespace:

   * node gone or no longer a search node → ``node_not_found``;
   * the namespace already has an index on that node (an existing replica or
     an evicted index not yet deleted, reference 10.5/10.6; the unique
     (enabled namespace, node) index would refuse it) →
     ``namespace_already_on_node``;
   * required bytes > the ledger's unclaimed bytes → ``node_capacity_exceeded``.

   One refusal refuses the **whole namespace**: none of its replicas is
   written (GitLab rolls back one replica at a time and may keep the
   others; here a namespace is all or nothing, like a plan failure).
3. **Write.** The accepted namespaces are inserted in chunks: one
   ``bulk_create`` for the chunk's replicas (state pending) and one for their
   indices (state pending, ``reserved_storage_bytes`` = required bytes,
   ``metadata`` = the project-namespace range with null ends removed), inside
   a savepoint. Should the database still refuse a chunk (something the checks
   did not foresee, such as a hand-written plan with two indices of one
   namespace on one node), the chunk's savepoint is rolled back and its
   namespaces are written one by one, each in its own savepoint, so only the
   offending namespace is left out (``provisioning_failed`` or
   ``namespace_already_on_node``) and nothing is half-written.
4. **Stamp.** Plan failures and refused namespaces get
   ``last_rollout_failed_at`` = ``clock.now()`` and
   ``metadata.rollout_required_storage_bytes`` (one statement); namespaces
   written successfully have ``last_rollout_failed_at`` cleared.
5. **Destroy.** The replicas listed by ``destroy`` plans are deleted in one
   statement, each only if it belongs to that namespace; their indices are
   detached by the ``ON DELETE SET NULL`` foreign key and orphaned later.

The number of statements depends on the number of namespaces (one chunk of
``CHUNK_SIZE`` at a time), never on the number of projects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction

from zoekt import clock
from zoekt.models import EnabledNamespace, Index, Node, Replica
from zoekt.reasons import Reason

#: Namespaces written per pair of bulk inserts.
CHUNK_SIZE = 500

_UNIQUE_NAMESPACE_NODE = "index_zoekt_indices_on_enabled_namespace_id_and_node_id"

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
    #: ``{namespace_id, replicas_destroyed}`` per destroy plan.
    successes: list[dict[str, Any]] = field(default_factory=list)
    #: ``{type, message, failed_namespace_id, node_id, replica_idx}``.
    errors: list[dict[str, Any]] = field(default_factory=list)
    #: Root namespace ids stamped ``last_rollout_failed_at`` (plan failures and refusals).
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

    def execute(self) -> ProvisioningResult:
        creates = list(self.plan.get("create", ()))
        failures = list(self.plan.get("failures", ()))
        destroys = list(self.plan.get("destroy", ()))
        with transaction.atomic():
            enabled = self._lock_enabled_namespaces([*creates, *failures])
            live = self._lock_nodes(creates)
            taken = self._existing_placements(creates)
            failed: dict[int, int] = {}  # enabled namespace id -> required bytes
            for ns_plan in failures:
                if self._enabled_for(ns_plan, enabled) is not None:
                    failed[ns_plan["enabled_namespace_id"]] = _required(ns_plan)
            accepted = []
            for ns_plan in creates:
                if self._enabled_for(ns_plan, enabled) is None:
                    self._error(
                        Reason.MISSING_ENABLED_NAMESPACE,
                        f"Enabled namespace {ns_plan['enabled_namespace_id']} for namespace "
                        f"{ns_plan['namespace_id']} not found",
                        ns_plan,
                    )
                elif self._check(ns_plan, live, taken):
                    accepted.append(ns_plan)
                else:
                    failed[ns_plan["enabled_namespace_id"]] = _required(ns_plan)
            done = len(creates) - len(accepted)
            for start in range(0, len(accepted), self.chunk_size):
                chunk = accepted[start : start + self.chunk_size]
                for ns_plan in self._write(chunk):
                    failed[ns_plan["enabled_namespace_id"]] = _required(ns_plan)
                done += len(chunk)
                if self.progress is not None:
                    self.progress(done, len(creates))
            self._stamp(enabled, failed)
            self._destroy(destroys)
        return self.result

    # ------------------------------------------------------------------ #
    # Locks and live numbers

    def _lock_enabled_namespaces(
        self, plans: Iterable[Mapping[str, Any]]
    ) -> dict[int, EnabledNamespace]:
        ids = sorted({ns_plan["enabled_namespace_id"] for ns_plan in plans})
        if not ids:
            return {}
        rows = (
            EnabledNamespace.objects.filter(id__in=ids)
            .select_for_update(no_key=True)
            .order_by("id")
        )
        return {row.id: row for row in rows}

    def _lock_nodes(self, creates: list[Mapping[str, Any]]) -> dict[int, _LiveNode]:
        ids = sorted(
            {
                index["node_id"]
                for ns_plan in creates
                for replica in ns_plan["replicas"]
                for index in replica["indices"]
            }
        )
        if not ids:
            return {}
        rows = (
            Node.objects.filter(id__in=ids)
            .with_unclaimed_storage_bytes()
            .select_for_update()
            .order_by("id")
            .values_list("id", "services", "annotated_unclaimed_storage_bytes")
        )
        return {
            node_id: _LiveNode(Node.Service.ZOEKT in services, unclaimed)
            for node_id, services, unclaimed in rows
        }

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

    # ------------------------------------------------------------------ #
    # The re-check

    def _check(
        self,
        ns_plan: Mapping[str, Any],
        live: dict[int, _LiveNode],
        taken: set[tuple[int, int]],
    ) -> bool:
        """Whether every index of the namespace still fits; debits the ledger if so."""
        enabled_id = ns_plan["enabled_namespace_id"]
        ledger: dict[int, int] = {}
        refused = False
        for replica_idx, replica in enumerate(ns_plan["replicas"]):
            for index in replica["indices"]:
                node_id = index["node_id"]
                required = index["required_storage_bytes"]
                node = live.get(node_id)
                if node is None or not node.for_search:
                    self._error(
                        Reason.NODE_NOT_FOUND,
                        f"Node {node_id} not found (deleted or no longer a search node)",
                        ns_plan,
                        node_id=node_id,
                        replica_idx=replica_idx,
                    )
                elif (enabled_id, node_id) in taken:
                    self._error(
                        Reason.NAMESPACE_ALREADY_ON_NODE,
                        f"Namespace {ns_plan['namespace_id']} already has an index on node "
                        f"{node_id}",
                        ns_plan,
                        node_id=node_id,
                        replica_idx=replica_idx,
                    )
                else:
                    available = ledger.get(node_id, node.unclaimed_storage_bytes)
                    if required <= available:
                        ledger[node_id] = available - required
                        continue
                    self._error(
                        Reason.NODE_CAPACITY_EXCEEDED,
                        f"Node {node_id} has {available} unclaimed bytes; the index needs "
                        f"{required}",
                        ns_plan,
                        node_id=node_id,
                        replica_idx=replica_idx,
                    )
                refused = True
                break  # as GitLab: the replica's first problem ends its check
        if refused:
            return False
        for node_id, unclaimed in ledger.items():
            live[node_id].unclaimed_storage_bytes = unclaimed
        return True

    # ------------------------------------------------------------------ #
    # Writing

    def _write(self, chunk: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Insert the chunk's rows; returns the namespaces the database refused."""
        try:
            with transaction.atomic():
                successes = self._insert(chunk)
        except DatabaseError as exc:
            if len(chunk) == 1:
                self._error(_database_reason(exc), _one_line(exc), chunk[0])
                return list(chunk)
            refused = []
            for ns_plan in chunk:
                refused.extend(self._write([ns_plan]))
            return refused
        self.result.successes.extend(successes)
        return []

    def _insert(self, chunk: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        replicas: list[Replica] = []
        planned: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
        for ns_plan in chunk:
            for replica_plan in ns_plan["replicas"]:
                replicas.append(
                    Replica(
                        zoekt_enabled_namespace_id=ns_plan["enabled_namespace_id"],
                        namespace_id=ns_plan["namespace_id"],
                        state=Replica.State.PENDING,
                        created_at=self.now,
                        updated_at=self.now,
                    )
                )
                planned.append((ns_plan, replica_plan))
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
            for replica, (ns_plan, replica_plan) in zip(replicas, planned, strict=True)
            for index in replica_plan["indices"]
        ]
        if indices:
            Index.objects.bulk_create(indices)
        return [
            {"namespace_id": ns_plan["namespace_id"], "replica_id": replica.id}
            for replica, (ns_plan, _) in zip(replicas, planned, strict=True)
        ]

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
            if row.root_namespace_id in created_roots
        }
        if created:
            EnabledNamespace.objects.filter(
                id__in=sorted(created), last_rollout_failed_at__isnull=False
            ).update(last_rollout_failed_at=None, updated_at=self.now)

    def _destroy(self, destroys: list[Mapping[str, Any]]) -> None:
        replica_ids: list[int] = []
        owner_ids: list[int] = []
        for ns_plan in destroys:
            for replica_id in ns_plan.get("replicas_to_destroy") or ():
                replica_ids.append(replica_id)
                owner_ids.append(ns_plan["enabled_namespace_id"])
        deleted: Counter[int] = Counter()
        if replica_ids:
            with connection.cursor() as cursor:
                cursor.execute(_DESTROY_SQL, [replica_ids, owner_ids])
                deleted.update(enabled_id for (enabled_id,) in cursor.fetchall())
        for ns_plan in destroys:
            self.result.successes.append(
                {
                    "namespace_id": ns_plan["namespace_id"],
                    "replicas_destroyed": deleted[ns_plan["enabled_namespace_id"]],
                }
            )

    # ------------------------------------------------------------------ #

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
                "failed_namespace_id": ns_plan["namespace_id"],
                "node_id": node_id,
                "replica_idx": replica_idx,
            }
        )


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


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
