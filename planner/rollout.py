"""One rollout run: clean up, select, load, plan, log, apply (GitLab's ``RolloutService``, 5.5).

1. Unless it is a dry run, delete every replica without indices, 1,000 at a
   time (lost-node clean-up leaves them; deleting them is how their
   namespaces get re-placed).
2. Select (``planner.selection``). No namespaces, or no nodes: stop with
   that result, no re-enqueue. Namespaces selection skips (GitLab's project
   limit; those whose projects all lack statistics, which wait for them) are
   named in the run's summary, and the re-selection of step 7 skips them
   too, so they never cause a re-enqueue.
3. Load the scenario (``planner.loader``) and plan it (``planner.core``).
4. Log the whole plan as **one** structured JSON record (event and key
   ``zoekt_rollout_plan``), dry run or not, and keep it as a row for the
   dashboard (``planner.records``).
5. Dry run: stop here.
6. Apply (``planner.apply``).
7. Select again: re-enqueue when namespaces still need work and nodes are
   still available. The message follows GitLab's table: partial success,
   failure (errors only: no re-enqueue), success, or no changes.

``preview`` answers "what would the next rollout do?" for the operator
command: it runs steps 1–3 inside a transaction that is rolled back, so the
preview plans exactly what the next run would plan, and writes nothing.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from planner.apply import ProvisioningResult, ProvisioningService
from planner.core import plan as make_plan
from planner.loader import ScenarioLoader
from planner.plan import Plan
from planner.records import record_rollout_plan
from planner.scenario import parse_scenario
from planner.selection import DEFAULT_MAX_BATCH_SIZE, ResourcePool, SelectionService
from zoekt import capacity
from zoekt.logging import get_logger
from zoekt.models import Replica
from zoekt.reasons import Reason

log = get_logger(__name__)

#: GitLab's clean-up batch for replicas without indices.
CLEANUP_BATCH_SIZE = 1_000
PLAN_LOG_KEY = "zoekt_rollout_plan"


class Outcome(enum.StrEnum):
    NO_ENABLED_NAMESPACES = Reason.NO_ENABLED_NAMESPACES.value
    NO_AVAILABLE_NODES = Reason.NO_AVAILABLE_NODES.value
    DRY_RUN = Reason.DRY_RUN.value
    PARTIAL_SUCCESS = "partial_success"
    FAILURE = "failure"
    SUCCESS = "success"
    NO_CHANGES = "no_changes"


MESSAGES = {
    Outcome.NO_ENABLED_NAMESPACES: "No enabled namespaces found",
    Outcome.NO_AVAILABLE_NODES: "No available nodes found",
    Outcome.DRY_RUN: "Skipping execution of changes because of dry run",
    Outcome.PARTIAL_SUCCESS: "Batch is completed with partial success",
    Outcome.FAILURE: "Batch is completed with failure",
    Outcome.SUCCESS: "Batch is completed with success",
    Outcome.NO_CHANGES: "Batch is completed without changes",
}


@dataclass(slots=True)
class RolloutResult:
    outcome: Outcome
    re_enqueue: bool = False
    dry_run: bool = True
    changes: ProvisioningResult | None = None
    replicas_without_indices_deleted: int = 0
    pool: ResourcePool | None = None
    scenario: dict[str, Any] | None = None
    plan: Plan | None = None
    #: Seconds per phase: cleanup, select, load, plan, log, apply, reselect.
    seconds: dict[str, float] = field(default_factory=dict)
    #: Project rows loaded and the cursor round trips it took.
    projects_loaded: int = 0
    project_fetches: int = 0

    @property
    def message(self) -> str:
        return MESSAGES[self.outcome]

    def summary(self) -> dict[str, Any]:
        """The one log line of a run (the plan itself has its own record)."""
        out: dict[str, Any] = {
            "message": self.message,
            "outcome": str(self.outcome),
            "re_enqueue": self.re_enqueue,
            "dry_run": self.dry_run,
            "replicas_without_indices_deleted": self.replicas_without_indices_deleted,
        }
        if self.pool is not None:
            out["namespaces_selected"] = len(self.pool.namespaces)
            out["nodes_available"] = len(self.pool.nodes)
            out["namespaces_skipped"] = [skipped.as_dict() for skipped in self.pool.skipped]
        if self.plan is not None:
            out["plan"] = {
                "create": len(self.plan.create),
                "destroy": len(self.plan.destroy),
                "unchanged": len(self.plan.unchanged),
                "failures": len(self.plan.failures),
                "total_required_storage_bytes": self.plan.total_required_storage_bytes,
            }
        if self.changes is not None:
            out["changes"] = self.changes.as_dict()
        out["seconds"] = {phase: round(value, 4) for phase, value in self.seconds.items()}
        return out


class RolloutService:
    def __init__(
        self,
        *,
        max_indices_per_replica: int = capacity.MAX_INDICES_PER_REPLICA,
        record_decisions: bool = False,
        load_progress: Callable[[int, int, int], None] | None = None,
        apply_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.max_indices_per_replica = max_indices_per_replica
        self.record_decisions = record_decisions
        self.load_progress = load_progress
        self.apply_progress = apply_progress
        #: The phase running now (a benchmark attributes queries by it).
        self.phase = "idle"

    def execute(
        self, dry_run: bool = True, batch_size: int = DEFAULT_MAX_BATCH_SIZE
    ) -> RolloutResult:
        result = RolloutResult(Outcome.NO_CHANGES, dry_run=dry_run)
        if not dry_run:
            with self._phase(result, "cleanup"):
                result.replicas_without_indices_deleted = delete_replicas_without_indices()
        if not self._plan(result, batch_size):
            return self._done(result)

        with self._phase(result, "log"):
            log.info(PLAN_LOG_KEY, dry_run=dry_run, **{PLAN_LOG_KEY: result.plan.to_dict()})
            record_rollout_plan(result)  # the dashboard's copy (zoekt_rollout_plans)
        if dry_run:
            result.outcome = Outcome.DRY_RUN
            return self._done(result)

        with self._phase(result, "apply"):
            result.changes = ProvisioningService(
                result.plan.to_dict(), progress=self.apply_progress
            ).execute()
        with self._phase(result, "reselect"):
            again = SelectionService(batch_size)
            should_re_enqueue = bool(again.namespaces()) and bool(again.nodes())
        successes, errors = result.changes.successes, result.changes.errors
        if successes and errors:
            result.outcome, result.re_enqueue = Outcome.PARTIAL_SUCCESS, should_re_enqueue
        elif errors:
            result.outcome, result.re_enqueue = Outcome.FAILURE, False
        elif successes:
            result.outcome, result.re_enqueue = Outcome.SUCCESS, should_re_enqueue
        else:
            result.outcome, result.re_enqueue = Outcome.NO_CHANGES, should_re_enqueue
        return self._done(result)

    def preview(
        self, batch_size: int = DEFAULT_MAX_BATCH_SIZE, *, plan_anyway: bool = False
    ) -> RolloutResult:
        """What the next run would plan, with its clean-up rolled back; nothing is logged.

        With ``plan_anyway`` the scenario is loaded and planned even when the
        run would stop early (no namespaces, no nodes); ``outcome`` still says
        it would stop.
        """
        result = RolloutResult(Outcome.DRY_RUN, dry_run=True)
        with transaction.atomic():
            with self._phase(result, "cleanup"):
                result.replicas_without_indices_deleted = delete_replicas_without_indices()
            self._plan(result, batch_size, stop_early=not plan_anyway)
            transaction.set_rollback(True)
        return self._done(result)

    # ------------------------------------------------------------------ #

    def _plan(self, result: RolloutResult, batch_size: int, *, stop_early: bool = True) -> bool:
        """Select, load and plan into ``result``; False when there is nothing to plan."""
        with self._phase(result, "select"):
            result.pool = SelectionService(batch_size).execute()
        if not result.pool.namespaces:
            result.outcome = Outcome.NO_ENABLED_NAMESPACES
        elif not result.pool.nodes:
            result.outcome = Outcome.NO_AVAILABLE_NODES
        else:
            stop_early = False
        if stop_early:
            return False
        with self._phase(result, "load"):
            loader = ScenarioLoader(
                result.pool,
                max_indices_per_replica=self.max_indices_per_replica,
                progress=self.load_progress,
            )
            result.scenario = loader.load()
        result.projects_loaded, result.project_fetches = loader.projects_loaded, loader.fetches
        with self._phase(result, "plan"):
            result.plan = make_plan(
                parse_scenario(result.scenario), record_decisions=self.record_decisions
            )
        return True

    def _done(self, result: RolloutResult) -> RolloutResult:
        self.phase = "idle"
        return result

    def _phase(self, result: RolloutResult, name: str) -> _Phase:
        return _Phase(self, result, name)


class _Phase:
    """Times one phase into ``result.seconds`` and names it on the service."""

    def __init__(self, service: RolloutService, result: RolloutResult, name: str) -> None:
        self.service, self.result, self.name = service, result, name

    def __enter__(self) -> None:
        self.service.phase = self.name
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self.started
        self.result.seconds[self.name] = self.result.seconds.get(self.name, 0.0) + elapsed


def delete_replicas_without_indices(batch_size: int = CLEANUP_BATCH_SIZE) -> int:
    """Delete every replica that has no index, ``batch_size`` at a time; returns the count."""
    total = 0
    while True:
        ids = list(
            Replica.objects.without_indices()
            .order_by("id")
            .values_list("id", flat=True)[:batch_size]
        )
        if not ids:
            return total
        # Still index-less at delete time: nothing is attached in between.
        _, per_model = Replica.objects.filter(id__in=ids).without_indices().delete()
        total += per_model.get(Replica._meta.label, 0)
        if len(ids) < batch_size:
            return total
