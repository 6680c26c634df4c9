"""The Balance page's read model: ``balance_page``, the fleet's convergence to its desired
balance (docs/balance.md) as the API reports it (``eviction.rebalance.balance_report``,
the one report behind ``GET /api/v1/balance``, ``zoekt_balance --json`` and the metrics):
per node now and desired, the moves left, the reconciler's state and its last 24 hours;
and ``index_balance``, the namespace page's Balance section: the explain of each of its
indices (``planner.balance.explain_indices``, as ``GET /api/v1/indices/<id>/balance``).
The desired balance is computed in memory; the queries are the report's, a fixed number
whatever the fleet.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from eviction.balance_data import current_balance
from eviction.rebalance import balance_report
from planner.balance import IndexExplain, explain_indices

#: Moves listed on the page (the plan may hold hundreds; the count is shown in full).
MOVES_SHOWN = 50


@dataclasses.dataclass(frozen=True)
class BalanceMoveRow:
    index_id: int
    namespace_id: int | None
    from_name: str
    to_name: str
    bytes: int
    reason: str
    source_before: float
    source_after: float
    target_before: float
    target_after: float


@dataclasses.dataclass(frozen=True)
class BalancePage:
    #: The report, as the API serves it.
    report: dict[str, Any]
    nodes: list[dict[str, Any]]
    moves: list[BalanceMoveRow]
    #: Why a node takes nothing, by node id (its receiving rule's code).
    not_receiving: dict[int, str]

    @property
    def moves_not_shown(self) -> int:
        return len(self.report["moves"]) - len(self.moves)


def balance_page() -> BalancePage:
    fleet, balance, report = balance_report()
    names = {node.id: node.name for node in fleet.nodes}
    rows = [
        BalanceMoveRow(
            index_id=move.index_id,
            namespace_id=fleet.namespace_ids.get(move.index_id),
            from_name=names.get(move.from_node_id, str(move.from_node_id)),
            to_name=names.get(move.to_node_id, str(move.to_node_id)),
            bytes=move.bytes,
            reason=move.reason,
            source_before=move.source_before,
            source_after=move.source_after,
            target_before=move.target_before,
            target_after=move.target_after,
        )
        for move in balance.moves[:MOVES_SHOWN]
    ]
    return BalancePage(
        report=report,
        nodes=report["nodes"],
        moves=rows,
        not_receiving={
            node.id: node.not_receiving_reason or "" for node in fleet.nodes if not node.receiving
        },
    )


def index_balance(index_ids: list[int]) -> list[IndexExplain]:
    """The explain of each of ``index_ids`` in the fleet's desired balance (the report's,
    computed once), in that order; an index gone since the page read it is left out. The
    queries are the desired balance's input, a fixed number whatever the ids."""
    if not index_ids:
        return []
    fleet, balance = current_balance()
    held = {index.id for index in fleet.indices}
    return explain_indices(
        fleet.nodes,
        fleet.indices,
        [index_id for index_id in index_ids if index_id in held],
        fleet.options,
        balance=balance,
    )
