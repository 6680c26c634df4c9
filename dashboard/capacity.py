"""Capacity: the database edge of ``planner.provisioning`` (docs/capacity.md,
"Provisioning and what-if"). Read-only: it writes nothing and starts nothing.

``capacity_report`` reads

* the node history (``zoekt_node_samples``) over the window, summed per sample time
  into the fleet's used and indexed disk bytes and memory estimate: one grouped query;
* the fleet now as the desired balance sees it (``eviction.balance_data.balance_input``:
  every node with its disk, used bytes and budget, every index with its bytes and
  memory estimate), the nodes' indexed bytes, and the copies per namespace (one query);
* for a what-if, the nodes' unclaimed bytes and the plan-scenario of the namespaces
  whose replicas differ from the count asked for (the configured one unless
  ``--replicas``), with their projects (``planner.loader``, as a rollout reads them);

and returns the provisioning status and, for a change, the what-if, as one dict:
the body of ``GET /api/v1/capacity`` and of ``zoekt_capacity --json``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Sum

from dashboard.models import NodeSample
from eviction.balance_data import balance_input
from planner import provisioning as p
from planner.loader import load_scenario
from planner.selection import ResourcePool, SelectedNamespace
from zoekt import app_settings, clock
from zoekt.clock import EPOCH
from zoekt.models import EnabledNamespace, Node, Replica


def _seconds(at: datetime) -> float:
    return (at - EPOCH).total_seconds()


def fleet_history(now: datetime, window_seconds: float) -> list[p.FleetSample]:
    """The fleet's totals at each sample time in the window, oldest first (one query).
    A sample time at which some node has no row (offline) sums the nodes that have one."""
    rows = (
        NodeSample.objects.filter(sampled_at__gt=now - timedelta(seconds=window_seconds))
        .values("sampled_at")
        .annotate(
            used=Sum("used_bytes"),
            indexed=Sum("indexed_bytes"),
            memory=Sum("estimated_memory_bytes"),
            nodes=Count("node_id"),
        )
        .order_by("sampled_at")
    )
    return [
        p.FleetSample(
            at=_seconds(row["sampled_at"]),
            used_bytes=row["used"] or 0,
            indexed_bytes=row["indexed"] or 0,
            memory_bytes=row["memory"],
        )
        for row in rows
    ]


def _placed_copies() -> float:
    """The mean number of replicas a namespace with any index has (0: none)."""
    counts = list(
        Replica.objects.filter(indices__isnull=False)
        .values("zoekt_enabled_namespace_id")
        .annotate(n=Count("id", distinct=True))
        .values_list("n", flat=True)
    )
    return sum(counts) / len(counts) if counts else 0.0


def fleet_now(fleet, settings: app_settings.ZoektSettings) -> p.Fleet:
    """The forecast's view of the fleet now, from the balance's input."""
    sized = [n for n in fleet.nodes if n.total_bytes > 0]
    budgets = [n.memory_budget_bytes for n in sized]
    memory_on = fleet.options.memory and sized and all(b for b in budgets)
    indexed = Node.objects.filter(id__in=[n.id for n in sized]).aggregate(s=Sum("indexed_bytes"))
    return p.Fleet(
        nodes=len(sized),
        disk_bytes=sum(n.total_bytes for n in sized),
        memory_budget_bytes=sum(budgets) if memory_on else None,  # type: ignore[arg-type]
        used_bytes=sum(n.used_bytes for n in sized),
        indexed_bytes=indexed["s"] or 0,
        memory_bytes=sum(i.estimated_memory_bytes for i in fleet.indices),
        node_size=p.node_size(
            (n.total_bytes for n in sized), (n.memory_budget_bytes for n in sized)
        ),
        replicas=settings.default_number_of_replicas,
        placed_copies=_placed_copies(),
    )


def _scenario(replicas: int | None, settings: app_settings.ZoektSettings) -> dict[str, Any]:
    """The plan-scenario of the enabled namespaces whose replica count differs from the
    count asked for (``replicas``, else each one's configured count)."""
    rows = EnabledNamespace.objects.annotate(replica_count=Count("replicas")).order_by("id")
    selected = []
    for row in rows:
        want = replicas or row.number_of_replicas(settings.default_number_of_replicas)
        if want != row.replica_count:
            selected.append(
                SelectedNamespace(row.id, row.root_namespace_id, want, row.replica_count)
            )
    return load_scenario(ResourcePool(namespaces=tuple(selected), nodes=()), settings=settings)


def _changed_fleet(fleet: p.Fleet, base, result: p.WhatIfResult) -> p.Fleet:
    """The forecast's fleet after a what-if: the nodes and capacities it leaves."""
    after_nodes = [(n_id, f) for n_id, _name, _b, f in result.nodes if f is not None]
    by_id = {n.id: n for n in base.nodes}
    change = result.change
    size = fleet.node_size
    added_disk = change.disk_bytes if change.disk_bytes is not None else size.disk_bytes
    added_budget = change.memory_budget_bytes or size.memory_budget_bytes
    disk = 0
    budget = 0
    for n_id, _f in after_nodes:
        node = by_id.get(n_id)
        disk += node.total_bytes if node else added_disk
        budget += (node.memory_budget_bytes if node else added_budget) or 0
    return p.Fleet(
        nodes=len(after_nodes),
        disk_bytes=disk,
        memory_budget_bytes=budget if fleet.memory_budget_bytes is not None else None,
        used_bytes=sum(f.used_bytes for _n, f in after_nodes),
        indexed_bytes=fleet.indexed_bytes
        + sum(b.bytes for b in result.builds)
        - sum(
            i.used_bytes for i in base.indices if i.replica_id in set(result.destroyed_replica_ids)
        ),
        memory_bytes=sum(f.memory_bytes for _n, f in after_nodes),
        node_size=size,
        replicas=change.replicas or fleet.replicas,
        placed_copies=change.replicas or fleet.placed_copies,
    )


def capacity_report(
    change: p.WhatIf | None = None,
    *,
    window_days: float = p.DEFAULT_WINDOW_SECONDS / p.DAY_SECONDS,
    now: datetime | None = None,
    settings: app_settings.ZoektSettings | None = None,
) -> dict[str, Any]:
    """The provisioning status now, in 30 and 90 days, and the what-if of ``change``."""
    now = now or clock.now()
    settings = settings or app_settings.current()
    options = p.ProvisioningOptions(window_seconds=window_days * p.DAY_SECONDS)
    base = balance_input(settings=settings, now=now)
    fleet = fleet_now(base, settings)
    history = fleet_history(now, options.window_seconds)
    report = p.provisioning(fleet, history, _seconds(now), options).as_dict()
    report["now"] = now.isoformat()
    report["history"] = [
        {"at": s.at, "used_bytes": s.used_bytes, "memory_bytes": s.memory_bytes} for s in history
    ]
    report["what_if"] = None
    if change is not None:
        unclaimed = dict(
            Node.objects.with_unclaimed_storage_bytes().values_list(
                "id", "annotated_unclaimed_storage_bytes"
            )
        )
        result = p.what_if(
            base.nodes,
            base.indices,
            base.options,
            change,
            scenario=_scenario(change.replicas, settings),
            unclaimed=unclaimed,
        )
        body = result.as_dict()
        after = _changed_fleet(fleet, base, result)
        body["provisioning_after"] = p.provisioning(
            after, history, _seconds(now), options
        ).as_dict()
        report["what_if"] = body
    return report
