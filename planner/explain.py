"""Why the plan looks the way it does, per namespace and per node.

Built from the decision records the core writes down as it plans
(``Plan.decisions``): for each new index, which node was taken and why each
earlier candidate in the candidate order was passed over; for each project
that found no node, why every candidate refused it; for each empty replica,
which candidates were usable and which one had the most room. The reasons
come from ``planner.filters`` and are data (``Rejection``); ``render_text``
turns the explanation into lines a person reads.

With the memory dimension on, requests and availability carry ``memory``
next to ``disk`` (``None`` available: no budget, no limit), a new index says
why it opened (``cause``: ``first``, ``disk``, ``memory_ceiling``,
``memory_budget``) and which memory warning a degraded choice raised, and a
``memory_overflow`` decision explains why a project stayed in an index past
its memory limit (every candidate that could not take a new index, and the
ones that could when the split was balanced instead).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from planner.filters import (
    ZONE_TAKEN,
    Rejection,
    candidate_rejections,
    empty_replica_rejections,
)
from planner.plan import (
    EMPTY_REPLICA,
    MEMORY_OVERFLOW,
    NEW_INDEX,
    NO_NODE,
    DecisionLog,
    NamespacePlan,
    Plan,
)
from planner.scenario import BALANCED, DISK, MEMORY


def explain(plan: Plan, *, namespace_id: int | None = None) -> list[dict[str, Any]]:
    """One explanation per namespace (in planning order), or only ``namespace_id``'s.

    The plan must have been made with ``record_decisions=True`` (the default).
    """
    log = plan.log
    if log is None:
        raise ValueError("this plan was made without decision records")
    by_namespace: dict[int, list[int]] = {}
    for sequence, decision in enumerate(log.decisions):
        if namespace_id is None or decision.namespace_id == namespace_id:
            by_namespace.setdefault(decision.namespace_id, []).append(sequence)
    return [
        _explain_namespace(log, ns_plan, by_namespace.get(ns_plan.namespace_id, []))
        for ns_plan in plan.namespaces_in_order
        if namespace_id is None or ns_plan.namespace_id == namespace_id
    ]


def _explain_namespace(
    log: DecisionLog, ns_plan: NamespacePlan, sequences: list[int]
) -> dict[str, Any]:
    node_ids = log.node_ids
    explained = [_explain_decision(log, sequence) for sequence in sequences]

    taken: dict[int, list[dict[str, Any]]] = {}
    passed: dict[int, Counter[str]] = {}
    for item in explained:
        if item["node_id"] is not None and item["kind"] != MEMORY_OVERFLOW:
            taken.setdefault(item["node_id"], []).append(
                {"replica_idx": item["replica_idx"], "index_idx": item["index_idx"]}
            )
        for entry in item["passed_over"]:
            counter = passed.setdefault(entry["node_id"], Counter())
            counter.update(reason["reason"] for reason in entry["reasons"])
    nodes = [
        {
            "node_id": node_id,
            "taken": taken.get(node_id, []),
            "passed_over": dict(sorted(passed.get(node_id, Counter()).items())),
        }
        for node_id in node_ids
        if node_id in taken or node_id in passed
    ]
    out: dict[str, Any] = {
        "namespace_id": ns_plan.namespace_id,
        "enabled_namespace_id": ns_plan.enabled_namespace_id,
        "action": ns_plan.action,
        "failed": ns_plan.failed,
        "errors": [error.to_dict() for error in ns_plan.errors],
        "warnings": [warning.to_dict() for warning in ns_plan.warnings],
        "decisions": explained,
        "nodes": nodes,
    }
    if ns_plan.replicas_to_destroy is not None:
        out["replicas_to_destroy"] = list(ns_plan.replicas_to_destroy)
    return out


def _explain_decision(log: DecisionLog, sequence: int) -> dict[str, Any]:
    decision = log.decisions[sequence]
    node_ids = log.node_ids
    chosen = decision.node_position
    passed_over: list[dict[str, Any]] = []
    not_best: list[dict[str, Any]] = []
    usable: list[dict[str, Any]] = []
    if decision.kind == MEMORY_OVERFLOW:
        # Every other candidate: why it could not take a new index of the
        # replica, or (a balanced split) that it could.
        _sort_others(log, sequence, passed_over, usable)
    elif decision.kind == EMPTY_REPLICA:
        for position, node_id in enumerate(node_ids):
            if position == chosen:
                continue
            available = log.available(sequence, position)
            zone = _zone_set_aside(log, decision, position)
            reasons = empty_replica_rejections(
                node_id, available, exhausted=position in decision.exhausted and not zone
            )
            if zone:
                reasons.insert(0, Rejection(node_id, ZONE_TAKEN))
            if reasons:
                passed_over.append(_entry(node_id, reasons))
            else:
                # Usable, but the chosen node had more unclaimed storage (or
                # as much and came first): "how good", not "can it".
                not_best.append({"node_id": node_id, "available": available})
    elif log.strategy == BALANCED:
        # Every other candidate: why it could not take the index, or that it could
        # but had less room left than the chosen one.
        _sort_others(log, sequence, passed_over, not_best)
    else:
        considered = len(node_ids) if chosen is None else chosen
        for position in range(considered):
            reasons = _rejections(
                log, decision, position, node_ids[position], log.available(sequence, position)
            )
            passed_over.append(_entry(node_ids[position], reasons))
    out: dict[str, Any] = {
        "kind": decision.kind,
        "replica_idx": decision.replica_idx,
        "index_idx": decision.index_idx,
        "project_id": decision.project_id,
        "project_namespace_id": decision.project_namespace_id,
        "requested": dict(decision.requested),
        "node_id": None if chosen is None else node_ids[chosen],
        "available": None if chosen is None else log.available(sequence, chosen),
        "passed_over": passed_over,
    }
    if decision.kind == EMPTY_REPLICA or (log.strategy == BALANCED and chosen is not None):
        out["not_best"] = not_best
    if log.capacity is not None and chosen is not None and decision.kind == NEW_INDEX:
        # The balanced score of the chosen node (the share of its capacity left,
        # planner.filters.node_score), beside each usable one's in not_best.
        out["score"] = log.score(out["available"], chosen, decision.requested)
    if decision.kind == MEMORY_OVERFLOW:
        out["usable"] = usable
    if log.memory and decision.kind != EMPTY_REPLICA:
        out["cause"] = decision.cause
        out["warning"] = decision.warning
    return out


def _sort_others(
    log: DecisionLog,
    sequence: int,
    passed_over: list[dict[str, Any]],
    could: list[dict[str, Any]],
) -> None:
    """Every candidate but the chosen one: into ``passed_over`` with why it could not
    take the index, or into ``could`` with what it had."""
    decision = log.decisions[sequence]
    for position, node_id in enumerate(log.node_ids):
        if position == decision.node_position:
            continue
        available = log.available(sequence, position)
        reasons = _rejections(log, decision, position, node_id, available)
        if reasons:
            passed_over.append(_entry(node_id, reasons))
        else:
            entry: dict[str, Any] = {"node_id": node_id, "available": available}
            if log.capacity is not None:
                entry["score"] = log.score(available, position, decision.requested)
            could.append(entry)


def _zone_set_aside(log: DecisionLog, decision: Any, position: int) -> bool:
    """Whether the zone rule, not the namespace's own index, excluded the node."""
    if not log.zone_excluded or decision.replica_idx is None:
        return False
    key = (decision.namespace_id, decision.replica_idx)
    return position in log.zone_excluded.get(key, ())


def _rejections(
    log: DecisionLog,
    decision: Any,
    position: int,
    node_id: int,
    available: dict[str, int | None],
) -> list[Rejection]:
    """``candidate_rejections`` of the node, the zone rule's exclusion named as such."""
    zone = _zone_set_aside(log, decision, position)
    reasons = candidate_rejections(
        node_id,
        decision.requested,
        available,
        exhausted=position in decision.exhausted and not zone,
    )
    if zone:
        reasons.insert(0, Rejection(node_id, ZONE_TAKEN))
    return reasons


def _entry(node_id: int, reasons: list[Rejection]) -> dict[str, Any]:
    return {"node_id": node_id, "reasons": [reason.to_dict() for reason in reasons]}


# --------------------------------------------------------------------------- #
# Text
# --------------------------------------------------------------------------- #


def render_text(explanations: Iterable[dict[str, Any]]) -> str:
    lines: list[str] = []
    for ns in explanations:
        verdict = "FAILED" if ns["failed"] else "ok"
        lines.append(
            f"namespace {ns['namespace_id']} (enabled namespace {ns['enabled_namespace_id']}): "
            f"{ns['action']}, {verdict}"
        )
        if "replicas_to_destroy" in ns:
            ids = ", ".join(str(i) for i in ns["replicas_to_destroy"])
            lines.append(f"  replicas to destroy: {ids}")
        for error in ns["errors"]:
            where = "" if error["replica_idx"] is None else f" (replica {error['replica_idx']})"
            lines.append(f"  error {error['type']}{where}: {error['details']}")
        for warning in ns.get("warnings", []):
            where = "" if warning["replica_idx"] is None else f" (replica {warning['replica_idx']})"
            lines.append(f"  warning {warning['type']}{where}: {warning['details']}")
        for decision in ns["decisions"]:
            lines.extend(_decision_lines(decision))
        if ns["nodes"]:
            lines.append("  nodes:")
            for node in ns["nodes"]:
                parts = [
                    f"index {t['index_idx']} of replica {t['replica_idx']}" for t in node["taken"]
                ]
                text = "took " + ", ".join(parts) if parts else "took nothing"
                if node["passed_over"]:
                    reasons = ", ".join(
                        f"{reason.replace('_', ' ')} ×{count}"
                        for reason, count in node["passed_over"].items()
                    )
                    text += f"; passed over: {reasons}"
                lines.append(f"    node {node['node_id']}: {text}")
    return "\n".join(lines) + ("\n" if lines else "")


_CAUSES = {
    "first": "the replica's first index",
    "disk": "the last index was full on disk",
    "disk_ceiling": "the last index reached its max_storage_bytes under the disk ceiling",
    "memory_ceiling": "the last index reached its max_memory_bytes",
    "memory_budget": "the last index's node ran out of memory budget",
}


def _amount(value: int | None) -> str:
    return "no limit" if value is None else f"{value:,}"


def _decision_lines(decision: dict[str, Any]) -> list[str]:
    requested = decision["requested"][DISK]
    memory = decision["requested"].get(MEMORY)
    if decision["kind"] == NEW_INDEX:
        head = (
            f"  replica {decision['replica_idx']} index {decision['index_idx']}: node "
            f"{decision['node_id']} for project {decision['project_id']} (project namespace "
            f"{decision['project_namespace_id']}), requested {requested:,} bytes, node had "
            f"{decision['available'][DISK]:,} unclaimed"
        )
        if decision.get("score") is not None:
            head += f", score {decision['score']:.4f} (the share of its capacity left)"
        if memory is not None:
            head += (
                f"; memory requested {memory:,} bytes, node had "
                f"{_amount(decision['available'][MEMORY])} unclaimed"
            )
            if decision.get("cause") in _CAUSES:
                head += f" ({_CAUSES[decision['cause']]})"
            if decision.get("warning"):
                head += f"; degraded to the disk-only choice: {decision['warning']}"
    elif decision["kind"] == MEMORY_OVERFLOW:
        head = (
            f"  replica {decision['replica_idx']} index {decision['index_idx']}: project "
            f"{decision['project_id']} (project namespace {decision['project_namespace_id']}, "
            f"memory {memory:,} bytes) stays on node {decision['node_id']} past the index's "
            f"memory limit: {decision['warning']}"
        )
    elif decision["kind"] == NO_NODE:
        head = (
            f"  replica {decision['replica_idx']}: no node for project {decision['project_id']} "
            f"(project namespace {decision['project_namespace_id']}), requested {requested:,} bytes"
        )
        if memory is not None:
            head += f" and {memory:,} bytes of memory"
    elif decision["node_id"] is not None:
        head = (
            f"  replica {decision['replica_idx']} (empty): node {decision['node_id']}, the most "
            f"unclaimed storage ({decision['available'][DISK]:,} bytes) among usable nodes"
        )
    else:
        head = f"  replica {decision['replica_idx']} (empty): no usable node"
    lines = [head]
    for entry in decision["passed_over"]:
        reasons = "; ".join(Rejection(**reason).describe() for reason in entry["reasons"])
        lines.append(f"    node {entry['node_id']} passed over: {reasons}")
    for entry in decision.get("not_best", []):
        if entry.get("score") is not None:
            lines.append(
                f"    node {entry['node_id']} usable, scored lower: {entry['score']:.4f} "
                f"({entry['available'][DISK]:,} bytes)"
            )
        else:
            lines.append(
                f"    node {entry['node_id']} usable, not the roomiest: "
                f"{entry['available'][DISK]:,} bytes"
            )
    for entry in decision.get("usable", []):
        lines.append(
            f"    node {entry['node_id']} could take a new index ({entry['available'][DISK]:,} "
            f"bytes unclaimed storage, {_amount(entry['available'][MEMORY])} memory); the split "
            "was balanced instead"
        )
    return lines
