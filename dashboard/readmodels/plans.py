"""The rollout plans pages' read models: ``recent_plans`` (the list) and
``plan_detail`` (one plan, namespace by namespace), from the plans kept by
``planner.records``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from django.core.paginator import Page

from dashboard.readmodels.common import page_of
from planner.models import RolloutPlan
from zoekt.models import Namespace, natural_key


@dataclasses.dataclass(frozen=True)
class PlanRow:
    id: int
    created_at: datetime
    dry_run: bool
    summary: dict[str, Any]

    @property
    def bounds(self) -> list[dict[str, Any]]:
        """``[{dimension, lower_bound, max_utilization, ratio}]`` (disk first)."""
        return [
            {"dimension": dimension, **values}
            for dimension, values in sorted(
                (self.summary.get("bounds") or {}).items(), key=lambda item: item[0] != "disk"
            )
        ]


def recent_plans(limit: int = 50) -> list[PlanRow]:
    """The newest rollout plans, without their plan and explanation bodies (one query)."""
    return [
        PlanRow(**row)
        for row in RolloutPlan.objects.order_by("-id").values(
            "id", "created_at", "dry_run", "summary"
        )[:limit]
    ]


@dataclasses.dataclass(frozen=True)
class PlannedIndexView:
    node_id: int
    node_name: str
    project_namespace_id_from: int | None
    project_namespace_id_to: int | None
    required_storage_bytes: int
    estimated_memory_bytes: int | None


@dataclasses.dataclass(frozen=True)
class Rejected:
    reason: str
    count: int
    dimension: str | None = None
    requested: int | None = None
    available: int | None = None


@dataclasses.dataclass(frozen=True)
class CandidateView:
    node_id: int
    node_name: str
    taken: list[tuple[int, int]]
    #: One entry per reason, with the last amounts requested and available.
    rejected: list[Rejected]
    detail: str | None


@dataclasses.dataclass(frozen=True)
class NamespacePlanView:
    namespace_id: int
    enabled_namespace_id: int
    path: str | None
    action: str
    failed: bool
    errors: list[dict[str, Any]]
    warnings: list[dict[str, Any]]
    required_storage_bytes: int
    replicas: list[list[PlannedIndexView]]
    replicas_to_destroy: list[int] | None
    #: None: this namespace was not explained (or the run kept no records).
    candidates: list[CandidateView] | None
    decisions: list[dict[str, Any]]
    decisions_total: int
    #: Balanced runs: each kept new-index decision's node and score, and the best
    #: usable nodes passed over with theirs.
    scores: list[ScoreView] = dataclasses.field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.failed:
            return "failed"
        if self.warnings:
            return "warnings"
        return "ok"


@dataclasses.dataclass(frozen=True)
class ScoreView:
    replica_idx: int
    index_idx: int
    node_name: str
    score: float
    runners_up: list[tuple[str, float]]


@dataclasses.dataclass(frozen=True)
class PlanDetail:
    row: PlanRow
    page: Page
    namespaces: list[NamespacePlanView]
    nodes: list[dict[str, Any]]
    node_names: dict[int, str]
    explained: bool

    @property
    def placed_nodes(self) -> int:
        return sum(1 for node in self.nodes if node.get("placed"))


PLAN_FILTERS = {"": "all", "failed": "failed", "warnings": "with warnings", "create": "create"}


def _share(part: int | None, whole: int | None) -> float | None:
    return part / whole if part is not None and whole and whole > 0 else None


def _plan_node(node: dict[str, Any], node_name: str) -> dict[str, Any]:
    """A plan's node entry for the page: disk always, memory when the plan had it."""
    out = {
        **node,
        "name": node_name,
        "placed": True,
        "utilization": _share(
            node["claimed_storage_bytes"], node["unclaimed_storage_bytes_before"]
        ),
    }
    if "unclaimed_memory_bytes_before" in node:
        before = node["unclaimed_memory_bytes_before"]
        after = node["unclaimed_memory_bytes_after"]
        claimed = None if before is None or after is None else before - after
        out["claimed_memory_bytes"] = claimed
        out["memory_utilization"] = _share(claimed, before)
    return out


def plan_detail(
    plan_id: int, *, filter: str = "", page: int | str = 1, per_page: int = 50
) -> PlanDetail | None:
    """One stored plan, its namespaces (failed first, then with warnings) a page at a time.

    Queries: the plan row (1) and the page's root namespace paths (1).
    """
    row = RolloutPlan.objects.filter(id=plan_id).first()
    if row is None:
        return None
    plan = row.plan or {}
    summary = row.summary or {}
    names = {int(key): value for key, value in (summary.get("node_names") or {}).items()}

    def name(node_id: int) -> str:
        return names.get(node_id, f"node-{node_id}")

    explained = {item["namespace_id"]: item for item in (row.explanation or [])}
    entries = [
        *plan.get("failures", []),
        *plan.get("create", []),
        *plan.get("destroy", []),
        *plan.get("unchanged", []),
    ]
    entries.sort(key=lambda ns: (not ns.get("errors"), not ns.get("warnings")))
    if filter == "failed":
        entries = [ns for ns in entries if ns.get("errors")]
    elif filter == "warnings":
        entries = [ns for ns in entries if ns.get("warnings")]
    elif filter == "create":
        entries = [ns for ns in entries if ns.get("action") == "create" and not ns.get("errors")]
    page_obj = page_of(entries, per_page, page)
    on_page = list(page_obj.object_list)
    paths = dict(
        Namespace.objects.filter(id__in=[ns["namespace_id"] for ns in on_page]).values_list(
            "id", "path"
        )
    )
    views = []
    for ns in on_page:
        item = explained.get(ns["namespace_id"])
        candidates = None
        if item is not None:
            candidates = [
                CandidateView(
                    node_id=node["node_id"],
                    node_name=name(node["node_id"]),
                    taken=[tuple(taken) for taken in node["taken"]],
                    rejected=[
                        Rejected(reason, count, **(node.get("last") or {}).get(reason, {}))
                        for reason, count in node["passed_over"].items()
                    ],
                    detail=node.get("detail"),
                )
                for node in item["nodes"]
            ]
            candidates.sort(key=lambda c: (natural_key(c.node_name), c.node_id))
        views.append(
            NamespacePlanView(
                namespace_id=ns["namespace_id"],
                enabled_namespace_id=ns["enabled_namespace_id"],
                path=paths.get(ns["namespace_id"]),
                action=ns["action"],
                failed=bool(ns.get("errors")),
                errors=ns.get("errors", []),
                warnings=ns.get("warnings", []),
                required_storage_bytes=ns.get("namespace_required_storage_bytes", 0),
                replicas=[
                    [
                        PlannedIndexView(
                            node_id=index["node_id"],
                            node_name=name(index["node_id"]),
                            project_namespace_id_from=index["projects"][
                                "project_namespace_id_from"
                            ],
                            project_namespace_id_to=index["projects"]["project_namespace_id_to"],
                            required_storage_bytes=index["required_storage_bytes"],
                            estimated_memory_bytes=index.get("estimated_memory_bytes"),
                        )
                        for index in replica["indices"]
                    ]
                    for replica in ns.get("replicas", [])
                ],
                replicas_to_destroy=ns.get("replicas_to_destroy"),
                candidates=candidates,
                decisions=[] if item is None else item["decisions"],
                decisions_total=0 if item is None else item["decisions_total"],
                scores=[
                    ScoreView(
                        d["replica_idx"],
                        d["index_idx"],
                        name(d["node_id"]),
                        d["score"],
                        [(name(r["node_id"]), r["score"]) for r in d.get("runners_up", ())],
                    )
                    for d in ([] if item is None else item["decisions"])
                    if d.get("score") is not None
                ],
            )
        )
    nodes = [_plan_node(node, name(node["id"])) for node in plan.get("nodes", [])]
    # The header counts every candidate: list the ones that took nothing too.
    placed = {node["id"] for node in nodes}
    nodes += [
        {"id": node_id, "name": node_name, "placed": False}
        for node_id, node_name in sorted(names.items(), key=lambda item: natural_key(item[1]))
        if node_id not in placed
    ]
    nodes.sort(key=lambda node: (natural_key(node["name"]), node["id"]))  # as on every page
    return PlanDetail(
        row=PlanRow(row.id, row.created_at, row.dry_run, summary),
        page=page_obj,
        namespaces=views,
        nodes=nodes,
        node_names=names,
        explained=row.explanation is not None,
    )
