"""Keep each rollout's plan as a row (``zoekt_rollout_plans``) for the dashboard.

``record_rollout_plan(result)`` is called by ``RolloutService.execute`` right
after it logs the plan record, dry run or not (``preview`` neither logs nor
records). It writes one ``RolloutPlan`` row and deletes all but the newest
``KEEP``:

* ``plan``: the plan dict, exactly as the ``zoekt_rollout_plan`` log record
  carries it;
* ``summary``: counts, the bounds (max utilisation over the lower bound),
  the candidate nodes' names, the namespaces selection skipped and why, the
  nodes it left out for their eviction cooldown (name, reason
  ``node_eviction_cooldown``, until when), the phase seconds so far
  (``summary``);
* ``explanation``: per namespace, the decisions and why each candidate node
  (by id and name) was taken or passed over (``compact_explanation``), for at most
  ``EXPLAINED_NAMESPACES`` namespaces (failed ones first, then those with
  warnings, then planning order) and ``DECISIONS_PER_NAMESPACE`` decisions
  each, so a run over thousands of namespaces stays a bounded row. NULL when
  the run kept no decision records.

The row is written in a savepoint and any error is logged and swallowed: the
dashboard's copy must never fail a rollout.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from django.db import transaction

from planner.plan import bounds_entry
from zoekt.logging import get_logger
from zoekt.reasons import Reason

if TYPE_CHECKING:
    from planner.models import RolloutPlan
    from planner.plan import Plan
    from planner.selection import ResourcePool

log = get_logger(__name__)


class RolloutRun(Protocol):
    """What a plan record is written from: one rollout run, as ``planner.rollout`` reports it.

    ``RolloutResult`` has these attributes; this module reads nothing else of
    it, so the record never imports the rollout service that calls it.
    """

    dry_run: bool
    plan: Plan | None
    pool: ResourcePool | None
    scenario: dict[str, Any] | None
    #: Seconds per phase so far.
    seconds: dict[str, float]


#: Rows kept: the newest ``KEEP`` plans, dry runs included.
KEEP = 50
EXPLAINED_NAMESPACES = 200
DECISIONS_PER_NAMESPACE = 20
#: Balanced runs: how many of the best-scored usable nodes a compact decision names.
RUNNERS_UP = 3

#: Pseudo-reason for a candidate that could have taken the index but was not
#: the best choice (an empty replica's less roomy nodes, a balanced split).
USABLE_NOT_CHOSEN = "usable_not_chosen"


def record_rollout_plan(result: RolloutRun) -> RolloutPlan | None:
    """Store ``result``'s plan as a ``RolloutPlan`` row and prune; None when nothing was stored."""
    if result.plan is None:
        return None
    try:
        with transaction.atomic():
            row = _create(result)
            prune()
        return row
    except Exception as exc:  # the dashboard's copy never fails a rollout
        log.warning("rollout_plan_not_recorded", error=f"{exc.__class__.__name__}: {exc}")
        return None


def _create(result: RolloutRun) -> RolloutPlan:
    from planner.models import RolloutPlan

    plan = result.plan
    plan_dict = plan.to_dict()
    names = node_names(result, plan_dict)
    explanation = compact_explanation(plan, names=names) if plan.log is not None else None
    return RolloutPlan.objects.create(
        dry_run=result.dry_run,
        summary=summary(result, plan_dict, explanation),
        plan=plan_dict,
        explanation=explanation,
    )


def prune(keep: int = KEEP) -> int:
    """Delete every plan row but the newest ``keep``; returns how many went."""
    from planner.models import RolloutPlan

    newest = RolloutPlan.objects.order_by("-id").values("id")[:keep]
    deleted, _ = RolloutPlan.objects.exclude(id__in=newest).delete()
    return deleted


# ----------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------


def summary(
    result: RolloutRun, plan_dict: dict[str, Any], explanation: list | None
) -> dict[str, Any]:
    plan = result.plan
    scenario = result.scenario or {}
    options = scenario.get("options") or {}
    namespaces = plan.namespaces_in_order or [
        *plan.create,
        *plan.destroy,
        *plan.unchanged,
        *plan.failures,
    ]
    nodes = result.pool.nodes if result.pool is not None else ()
    skipped = result.pool.skipped if result.pool is not None else ()
    bounds = plan_dict.get("bounds")
    bounds_source = "plan"
    if bounds is None:
        bounds = {"disk": disk_bounds(scenario, plan)}
        bounds_source = "disk_estimate"
    return {
        "outcome": "dry_run" if result.dry_run else None,
        "namespaces_selected": len(result.pool.namespaces) if result.pool is not None else None,
        "nodes_available": len(nodes),
        "node_names": {
            str(node_id): name or f"node-{node_id}"
            for node_id, name in node_names(result, plan_dict).items()
        },
        "namespaces_skipped": [entry.as_dict() for entry in skipped],
        "nodes_in_eviction_cooldown": nodes_in_eviction_cooldown(result),
        "namespaces_planned": len(namespaces),
        "create": len(plan.create),
        "destroy": len(plan.destroy),
        "unchanged": len(plan.unchanged),
        "failures": len(plan.failures),
        "namespaces_with_warnings": sum(1 for ns in namespaces if ns.warnings),
        "total_required_storage_bytes": plan.total_required_storage_bytes,
        "indices_planned": sum(len(node.indices) for node in plan.nodes),
        "buffer_factor": options.get("buffer_factor"),
        # How the run placed: the strategy and the options that go with it.
        "placement": {
            "strategy": options.get("strategy") or "first_fit",
            "order": options.get("order") or "given",
            "max_index_storage_fraction": options.get("max_index_storage_fraction"),
        },
        "memory": plan.bounds is not None,
        "bounds": bounds,
        "bounds_source": bounds_source,
        "explained_namespaces": None if explanation is None else len(explanation),
        "seconds": {phase: round(value, 4) for phase, value in result.seconds.items()},
    }


def node_names(result: RolloutRun, plan_dict: dict[str, Any]) -> dict[int, str | None]:
    """Each candidate's name (its metadata ``name``), else the plan's; None when it has none."""
    names: dict[int, str | None] = {}
    for node in plan_dict.get("nodes") or ():
        if node.get("name"):
            names[node["id"]] = str(node["name"])
    for node in result.pool.nodes if result.pool is not None else ():
        name = (node.metadata or {}).get("name")
        names[node.id] = str(name) if name else names.get(node.id)
    return names


def nodes_in_eviction_cooldown(result: RolloutRun) -> list[dict[str, Any]]:
    """The nodes selection left out for their eviction cooldown, in candidate order.

    Each: ``node_id``, ``node_name`` (its metadata ``name``, else ``node-<id>``,
    as in ``node_names``), ``reason`` (``node_eviction_cooldown``) and
    ``cooldown_until`` (ISO 8601). One query for the names, only when a node
    is cooling down.
    """
    cooling = result.pool.cooling_excluded if result.pool is not None else ()
    if not cooling:
        return []
    from zoekt.models import Node

    names = dict(
        Node.objects.filter(id__in=[node_id for node_id, _ in cooling]).values_list(
            "id", "metadata__name"
        )
    )
    return [
        {
            "node_id": node_id,
            "node_name": str(names.get(node_id) or f"node-{node_id}"),
            "reason": str(Reason.NODE_EVICTION_COOLDOWN),
            "cooldown_until": until.isoformat(),
        }
        for node_id, until in cooling
    ]


def disk_bounds(scenario: dict[str, Any], plan: Plan) -> dict[str, float | None]:
    """Max disk utilisation over a lower bound, for plans made without the memory dimension.

    The same definition as the core's bounds (docs/planner.md): a node's
    capacity is its unclaimed storage at the start of the run, what the run
    claimed is its planned indices' bytes; ``max_utilization`` is the largest
    claimed ÷ capacity and ``lower_bound`` is max(total claimed ÷ total
    positive capacity, largest placed project ÷ largest capacity). The
    largest placed project is taken over the namespaces whose plan succeeded
    (each of their projects with statistics was placed), so this bound can
    only be lower than the core's: still a bound no placement can beat.
    """
    capacity = {node["id"]: node["unclaimed_storage_bytes"] for node in scenario.get("nodes", [])}
    claimed = {node.id: node.claimed_storage_bytes for node in plan.nodes}
    factor = (scenario.get("options") or {}).get("buffer_factor") or 3
    succeeded = {ns.namespace_id for ns in plan.create}
    largest = 0
    for namespace in scenario.get("namespaces", []):
        if namespace["namespace_id"] not in succeeded:
            continue
        for project in namespace.get("projects", []):
            size = project.get("repository_size")
            if size:
                largest = max(largest, math.ceil(size * factor))
    positive = [have for have in capacity.values() if have > 0]
    total = sum(positive)
    demand = sum(claimed.values())
    utilization: float | None = 0.0
    for node_id, taken in claimed.items():
        have = capacity.get(node_id, 0)
        if have > 0:
            utilization = max(utilization, taken / have) if utilization is not None else None
        elif taken > 0:
            utilization = None
    lower: float | None
    if demand == 0:
        lower = 0.0
    elif not positive:
        lower = None
    else:
        lower = max(demand / total, largest / max(positive))
    return bounds_entry(lower, utilization)


# ----------------------------------------------------------------------------
# Explanation
# ----------------------------------------------------------------------------


def compact_explanation(
    plan: Plan,
    *,
    max_namespaces: int = EXPLAINED_NAMESPACES,
    max_decisions: int = DECISIONS_PER_NAMESPACE,
    names: dict[int, str | None] | None = None,
) -> list[dict[str, Any]]:
    """``planner.explain`` for the most telling namespaces, cut down to a bounded size.

    Per namespace: its verdict, errors and warnings; per candidate node (in
    candidate order, with its name from ``names``, None when it has none) the
    indices it took, how often it was passed over for
    which reason, for each reason the last requested and available amounts
    (``last``) and the last rejection in words (``detail``); and the first
    ``max_decisions`` decisions without their per-candidate lists.
    """
    from planner.explain import explain

    ordered = sorted(
        plan.namespaces_in_order,
        key=lambda ns: (not ns.errors, not ns.warnings),  # stable: planning order within
    )
    chosen = ordered[:max_namespaces]
    keep = {ns.namespace_id for ns in chosen}
    subset = dataclasses.replace(
        plan, namespaces_in_order=[ns for ns in plan.namespaces_in_order if ns.namespace_id in keep]
    )
    position = {node_id: i for i, node_id in enumerate(plan.log.node_ids)}
    return [
        {
            "namespace_id": item["namespace_id"],
            "enabled_namespace_id": item["enabled_namespace_id"],
            "action": item["action"],
            "failed": item["failed"],
            "errors": item["errors"],
            "warnings": item["warnings"],
            "replicas_to_destroy": item.get("replicas_to_destroy"),
            "nodes": _candidates(item, position, names or {}),
            "decisions": [_compact_decision(d) for d in item["decisions"][:max_decisions]],
            "decisions_total": len(item["decisions"]),
        }
        for item in explain(subset)
    ]


def _candidates(
    item: dict[str, Any], position: dict[int, int], names: dict[int, str | None]
) -> list[dict[str, Any]]:
    """Per candidate node of one namespace, in candidate order: taken, passed over, why."""
    from planner.filters import Rejection

    nodes: dict[int, dict[str, Any]] = {}

    def node(node_id: int) -> dict[str, Any]:
        if node_id not in nodes:
            nodes[node_id] = {
                "node_id": node_id,
                "node_name": names.get(node_id),
                "taken": [],
                "passed_over": Counter(),
                "last": {},
                "detail": None,
            }
        return nodes[node_id]

    for summary_node in item["nodes"]:
        entry = node(summary_node["node_id"])
        entry["taken"] = [[t["replica_idx"], t["index_idx"]] for t in summary_node["taken"]]
        entry["passed_over"].update(summary_node["passed_over"])
    for decision in item["decisions"]:
        for passed in decision["passed_over"]:
            entry = node(passed["node_id"])
            for reason in passed["reasons"]:
                # The last time this reason was given: what was asked, what was there.
                entry["last"][reason["reason"]] = {
                    "dimension": reason["dimension"],
                    "requested": reason["requested"],
                    "available": reason["available"],
                }
            if passed["reasons"]:
                entry["detail"] = "; ".join(
                    Rejection(**reason).describe() for reason in passed["reasons"]
                )
        for usable in (*decision.get("not_best", ()), *decision.get("usable", ())):
            node(usable["node_id"])["passed_over"][USABLE_NOT_CHOSEN] += 1
    return [
        {**entry, "passed_over": dict(sorted(entry["passed_over"].items()))}
        for entry in sorted(nodes.values(), key=lambda e: position.get(e["node_id"], 0))
    ]


def _compact_decision(decision: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": decision["kind"],
        "replica_idx": decision["replica_idx"],
        "index_idx": decision["index_idx"],
        "project_id": decision["project_id"],
        "project_namespace_id": decision["project_namespace_id"],
        "requested": decision["requested"],
        "node_id": decision["node_id"],
        "available": decision["available"],
        "passed_over": len(decision["passed_over"]),
        # Balanced: the chosen node's score, and the best usable ones passed over.
        "score": decision.get("score"),
        "runners_up": [
            {"node_id": entry["node_id"], "score": entry["score"]}
            for entry in sorted(
                (e for e in decision.get("not_best", ()) if e.get("score") is not None),
                key=lambda e: (-e["score"], e["node_id"]),
            )[:RUNNERS_UP]
        ],
        "cause": decision.get("cause"),
        "warning": decision.get("warning"),
        "fits_last_index_node_id": decision.get("fits_last_index_node_id"),
    }
