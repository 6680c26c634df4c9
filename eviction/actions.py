"""Eviction at the database edge: read the fleet into the policy's shapes, carry decisions out.

Each trigger's run reads node snapshots and index rows, asks
``eviction.policy`` what to do, and for each decision, in one transaction:
locks the node row, re-checks that the chosen indices are still where and
what the decision saw, records the decision (``EvictionDecision``) and,
when it is applied, takes the chosen indices off the node:

* with the safeguards and ``zoekt_eviction_moves`` on (the default), for any
  trigger: each chosen index is moved (``eviction.moves``: its replacement
  built on another node while it serves, then swapped in); only recorded
  fallbacks (critical watermark, no node with room) are deleted now;
* otherwise, node level: the replicas holding the chosen indices are evicted at once
  (legacy: every replica of the chosen namespaces, GitLab's
  ``Replica.for_namespace``), through ``zoekt.actions.do_evict_replicas``,
  the one explicit replica-eviction path;
* index watermark and negative unclaimed storage: the chosen indices become
  ``pending_eviction`` and GitLab's shared tail (``evict_indices``, here too)
  evicts their replicas, as in GitLab.

Before a replica goes, the transaction counts the namespaces it leaves
without another ready replica and writes them into the decision's details:
the record says what losing search cost. With the safeguards an applied
decision starts the node's cooldown (``Node.eviction_cooldown_until``),
which ``end_cooldowns`` ends early once every index the decision chose is
gone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F

from eviction import moves
from eviction import policy as p
from eviction.models import EvictionDecision
from zoekt import actions, app_settings, buffer_factor, capacity, clock, transitions
from zoekt.logging import get_logger
from zoekt.models import EnabledNamespace, Index, Move, Namespace, Node, Replica
from zoekt.reasons import Reason

log = get_logger(__name__)

_STATE_NAMES = {state.value: state.name.lower() for state in Index.State}


def policy_from_settings(settings: app_settings.ZoektSettings | None = None) -> p.Policy:
    settings = settings or app_settings.current()
    low, high, critical = capacity.watermark_limits(app_settings.development_watermarks())
    return p.Policy(
        safeguards=settings.node_eviction_safeguards,
        sustain_seconds=settings.eviction_sustain_seconds,
        order=settings.eviction_order,
        low=low,
        high=high,
        critical=critical,
        placeholder_bytes=capacity.DEFAULT_USED_STORAGE_BYTES,
        buffer_factor=float(buffer_factor.global_buffer_factor()),
    )


def node_states(nodes: Iterable[Node]) -> list[p.NodeState]:
    out = []
    for node in nodes:
        unclaimed = getattr(node, "annotated_unclaimed_storage_bytes", None)
        out.append(
            p.NodeState(
                node.id,
                node.name,
                node.total_bytes,
                node.used_bytes,
                node.high_watermark_exceeded_at,
                node.eviction_cooldown_until,
                0 if unclaimed is None else int(unclaimed),
            )
        )
    return out


def index_rows(indices) -> list[p.IndexRow]:
    rows = indices.values_list(
        "id",
        "zoekt_node_id",
        "namespace_id",
        "zoekt_replica_id",
        "state",
        "used_storage_bytes",
        "reserved_storage_bytes",
    )
    return [
        p.IndexRow(i, node, ns, replica, _STATE_NAMES[state], used or 0, reserved or 0)
        for i, node, ns, replica, state, used, reserved in rows
    ]


# --------------------------------------------------------------------------- #
# The three triggers
# --------------------------------------------------------------------------- #


def run_node_level(*, now: datetime | None = None) -> dict[str, Any]:
    """Node-level eviction (trigger a) over the online search nodes at or over high."""
    now = now or clock.now()
    settings = app_settings.current()
    rules = policy_from_settings(settings)
    end_cooldowns(now=now)
    # A node being restarted or drained is neither evicted from nor a target (the drain
    # moves its indices off already; docs/operations.md).
    online = Node.objects.for_search().online(now).not_in_shutdown(now)
    hot = list(online.high_watermark_exceeded().order_by("id"))
    if not hot:
        return {"skipped": Reason.CONDITION_NOT_MET, "nodes_over_high_watermark": 0}
    # Indices already moving are on their way out: not chosen again, and their bytes
    # count as gone from the node's projected use.
    rows = index_rows(Index.objects.filter(zoekt_node__in=hot).exclude(id__in=_moving_index_ids()))
    sizes = None
    if not rules.safeguards:
        sizes = dict(
            Namespace.objects.filter(id__in={r.namespace_id for r in rows}).values_list(
                "id", "root_storage_statistics__repository_size"
            )
        )
    targets: list[p.Target] = []
    if rules.safeguards and rules.order == p.LARGEST_THAT_FITS:
        targets = [
            p.Target(node.id, int(node.annotated_unclaimed_storage_bytes), node.total_bytes)
            for node in online.with_unclaimed_storage_bytes()
            .not_in_eviction_cooldown(now)
            .order_by("id")
        ]
    states = node_states(hot)
    if rules.safeguards:
        leaving = moves.live_bytes_by_node()
        states = [
            dataclasses.replace(s, used_bytes=max(s.used_bytes - leaving.get(s.id, 0), 0))
            for s in states
        ]
    decisions = p.node_level(states, rows, rules, now, namespace_sizes=sizes, targets=targets)
    return _carry_out(decisions, settings, now, nodes_over_high_watermark=len(hot))


def run_index_watermark(*, now: datetime | None = None) -> dict[str, Any]:
    """Indices over their critical watermark (trigger b): up to 1,000 a run, by id."""
    now = now or clock.now()
    settings = app_settings.current()
    rules = policy_from_settings(settings)
    critical = index_rows(
        Index.objects.should_be_pending_eviction()
        .exclude(id__in=_moving_index_ids())
        .exclude(zoekt_node__in=Node.objects.in_shutdown(now))
        .order_by("id")[:PENDING_EVICTION_BATCH_SIZE]
    )
    if not critical:
        return {"skipped": Reason.CONDITION_NOT_MET, "critical_indices": 0}
    nodes = Node.objects.filter(id__in={r.node_id for r in critical}).order_by("id")
    decisions = p.index_watermark(node_states(nodes), critical, rules, now)
    return _carry_out(decisions, settings, now, critical_indices=len(critical))


def run_negative_unclaimed(node_ids: list[int], *, now: datetime | None = None) -> dict[str, Any]:
    """Nodes with negative unclaimed storage (trigger c), as GitLab's worker dispatched them.

    As GitLab's worker, it does nothing while indexing is disabled or paused.
    """
    now = now or clock.now()
    settings = app_settings.current()
    if settings.indexing_gate is not None:
        return {"skipped": settings.indexing_gate, "nodes_listed": len(node_ids)}
    rules = policy_from_settings(settings)
    nodes = list(
        Node.objects.for_search()
        .filter(id__in=node_ids)
        .not_in_shutdown(now)
        .negative_unclaimed_storage_bytes()
        .order_by("id")
    )
    rows = index_rows(
        Index.objects.filter(zoekt_node__in=nodes).exclude(id__in=_moving_index_ids())
    )
    decisions = p.negative_unclaimed(node_states(nodes), rows, rules, now)
    return _carry_out(
        decisions, settings, now, nodes_listed=len(node_ids), nodes_negative=len(nodes)
    )


PENDING_EVICTION_BATCH_SIZE = 1_000


def _moving_index_ids():
    """The source indices of live moves: on their way out, never chosen a second time."""
    return Move.objects.live().values("source_index_ref")


def _carry_out(
    decisions: list[p.Decision], settings: app_settings.ZoektSettings, now: datetime, **found
) -> dict[str, Any]:
    applied = skipped = 0
    namespaces: set[int] = set()
    per_node = []
    for decision in decisions:
        row = do_apply_decision(decision, settings=settings, now=now)
        if row.applied_at is not None:
            applied += 1
            namespaces.update(row.namespace_ids)
        else:
            skipped += 1
        per_node.append(
            {
                "node_id": decision.node_id,
                "trigger": decision.trigger,
                "reason": row.reason,
                "applied": row.applied_at is not None,
                "namespaces": row.namespaces_affected,
            }
        )
    return {
        **found,
        "decisions_applied": applied,
        "decisions_skipped": skipped,
        "namespaces_affected": len(namespaces),
        "nodes": per_node,
    }


# --------------------------------------------------------------------------- #
# GitLab's tail: the replicas of pending-eviction indices evicted (6.5(b))
# --------------------------------------------------------------------------- #

INDEX_TO_EVICT_BATCH_SIZE = 1_000


def evict_indices() -> dict[str, Any]:
    """Evict the whole replicas of up to 1,000 pending-eviction indices (reference 6.5(b)).

    GitLab's IndexToEvictEventWorker: the tail the index-watermark and
    negative-unclaimed triggers share (they mark indices ``pending_eviction``;
    ``indices_to_evict_check`` dispatches this). In one transaction every index
    of those replicas becomes ``evicted`` and the replica rows are deleted; the
    indices, now without a replica, are then orphaned and deleted, and the
    rollout re-plans the namespace.
    """
    now = clock.now()
    with transaction.atomic():
        rows = list(
            Index.objects.filter(state=Index.State.PENDING_EVICTION)
            .select_for_update()
            .order_by("id")
            .values_list("id", "zoekt_replica_id")[:INDEX_TO_EVICT_BATCH_SIZE]
        )
        replica_ids = sorted({replica_id for _, replica_id in rows if replica_id is not None})
        evicted = actions.do_evict_replicas(replica_ids, now=now)
    return {
        "pending_eviction_indices": len(rows),
        "indices_evicted": evicted.indices_evicted,
        "replicas_deleted": evicted.replicas_deleted,
        "re_emit": False,
    }


# --------------------------------------------------------------------------- #
# One decision, in one transaction
# --------------------------------------------------------------------------- #


def do_apply_decision(
    decision: p.Decision,
    *,
    settings: app_settings.ZoektSettings | None = None,
    now: datetime | None = None,
) -> EvictionDecision:
    """Record ``decision`` and, if it is to be applied, carry it out (one transaction).

    How it is carried out depends on the mode (``_carrier``): moves, the
    legacy node-level deletion of whole namespaces, the node-level deletion
    of the chosen replicas, or marking the chosen indices pending eviction.
    """
    settings = settings or app_settings.current()
    now = now or clock.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(id=decision.node_id).first()
        if not decision.apply:
            return _record_skipped(decision, node, now)
        chosen, stale = _recheck(decision)
        if not chosen and not decision.namespace_ids:
            return _record_skipped(
                decision, node, now, reason=Reason.EVICTION_NOTHING_ELIGIBLE, changed=stale
            )
        details: dict[str, Any] = dict(decision.details)
        if stale:
            details["changed_since_decided"] = stale
        carry_out = _carrier(decision, settings, node)
        done = carry_out(decision, node, chosen, details, settings, now)
        if isinstance(done, EvictionDecision):
            return done
        row = _record_applied(decision, node, done, details, settings, now)
    log.info(
        "eviction_decision",
        node_id=decision.node_id,
        node_name=decision.node_name,
        trigger=decision.trigger,
        mode=decision.mode,
        reason=decision.reason,
        namespaces=row.namespaces_affected,
        chosen_bytes=row.chosen_bytes,
        projected_used_bytes=decision.projected_used_bytes,
    )
    return row


def _carrier(
    decision: p.Decision, settings: app_settings.ZoektSettings, node: Node | None
) -> Callable[..., list[p.Chosen] | EvictionDecision]:
    """How an applied decision is carried out, by mode and trigger."""
    if decision.mode == p.SAFEGUARDS and settings.eviction_moves and node is not None:
        return _move_chosen
    if decision.trigger == p.NODE_LEVEL:
        if decision.mode == p.LEGACY:
            return _evict_namespaces
        return _evict_chosen_replicas
    return _mark_pending_eviction


def _move_chosen(
    decision: p.Decision,
    node: Node,
    chosen: list[p.Chosen],
    details: dict[str, Any],
    settings: app_settings.ZoektSettings,
    now: datetime,
) -> list[p.Chosen] | EvictionDecision:
    """Safeguards with moves, every trigger: each chosen index's replacement is
    built elsewhere while it serves; only the recorded fallbacks are deleted
    now. Returns what was moved or deleted, or the skip when nothing was."""
    rules = policy_from_settings(settings)
    started = moves.start_moves(
        chosen,
        source=node,
        trigger=decision.trigger,
        critical=bool(decision.total_bytes)
        and decision.used_bytes / decision.total_bytes >= rules.critical,
        target_ceiling=capacity.hysteresis_floor(rules.high),
        settings=settings,
        now=now,
    )
    details["moves_started"] = [m.id for m in started.moves]
    details["not_moved"] = started.not_moved
    moving = {m.source_index_ref for m in started.moves}
    fallback = set(started.fallback_replica_ids)
    chosen = [c for c in chosen if c.index_id in moving or c.replica_id in fallback]
    if not chosen:
        return _record_skipped(
            decision,
            node,
            now,
            reason=Reason.EVICTION_NOTHING_ELIGIBLE,
            not_moved=started.not_moved,
        )
    _evict(sorted(fallback), details, now)
    return chosen


def _evict_namespaces(
    decision: p.Decision,
    node: Node | None,
    chosen: list[p.Chosen],
    details: dict[str, Any],
    settings: app_settings.ZoektSettings,
    now: datetime,
) -> list[p.Chosen]:
    """Legacy node-level (GitLab's): every replica of the chosen namespaces goes."""
    replica_ids = list(
        Replica.objects.filter(namespace_id__in=decision.namespace_ids).values_list("id", flat=True)
    )
    for enabled in EnabledNamespace.objects.filter(root_namespace_id__in=decision.namespace_ids):
        enabled.update_last_used_storage_bytes()
    _evict(replica_ids, details, now, record_used=False)
    return chosen


def _evict_chosen_replicas(
    decision: p.Decision,
    node: Node | None,
    chosen: list[p.Chosen],
    details: dict[str, Any],
    settings: app_settings.ZoektSettings,
    now: datetime,
) -> list[p.Chosen]:
    """Node-level with the safeguards, no moves: the chosen indices' replicas go."""
    _evict(sorted({c.replica_id for c in chosen if c.replica_id is not None}), details, now)
    return chosen


def _mark_pending_eviction(
    decision: p.Decision,
    node: Node | None,
    chosen: list[p.Chosen],
    details: dict[str, Any],
    settings: app_settings.ZoektSettings,
    now: datetime,
) -> list[p.Chosen]:
    """The index triggers, no moves: the chosen indices are marked pending eviction.

    GitLab's walk (legacy) re-marks evicted and orphaned indices too; the
    safeguards chose ready ones only (re-checked before)."""
    details["indices_marked_pending_eviction"] = transitions.mark_indices_pending_eviction(
        Index.objects.filter(id__in=[c.index_id for c in chosen]), now=now
    )
    return chosen


def _record_applied(
    decision: p.Decision,
    node: Node | None,
    chosen: list[p.Chosen],
    details: dict[str, Any],
    settings: app_settings.ZoektSettings,
    now: datetime,
) -> EvictionDecision:
    """The applied decision's row; its moves point at it, and (safeguards) the
    node cools down."""
    namespace_ids = list(decision.namespace_ids) or sorted({c.namespace_id for c in chosen})
    row = _new_row(
        decision,
        node,
        now,
        reason=decision.reason,
        applied_at=now,
        chosen=[_chosen_dict(c) for c in chosen],
        index_ids=[c.index_id for c in chosen],
        namespace_ids=namespace_ids,
        namespaces_affected=len(namespace_ids),
        details=details,
    )
    if details.get("moves_started"):
        Move.objects.filter(id__in=details["moves_started"]).update(decision_id=row.id)
    if node is not None and decision.mode == p.SAFEGUARDS:
        node.eviction_cooldown_until = now + timedelta(seconds=settings.eviction_cooldown_seconds)
        Node.objects.filter(id=node.id).update(eviction_cooldown_until=node.eviction_cooldown_until)
    return row


def _evict(
    replica_ids: list[int], details: dict[str, Any], now: datetime, *, record_used: bool = True
) -> None:
    """Delete these replicas (the one replica-eviction path), writing into ``details``
    how many namespaces that leaves without a ready replica."""
    if record_used:
        for enabled in EnabledNamespace.objects.filter(replicas__id__in=replica_ids).distinct():
            enabled.update_last_used_storage_bytes()
    details["namespaces_left_without_ready_replica"] = _left_dark(replica_ids)
    evicted = actions.do_evict_replicas(replica_ids, now=now)
    details["replicas_deleted"] = evicted.replicas_deleted
    details["indices_evicted"] = evicted.indices_evicted


def _recheck(decision: p.Decision) -> tuple[list[p.Chosen], int]:
    """The chosen indices still on the node in the state the decision saw (locked)."""
    if not decision.chosen:
        return [], 0
    ids = [c.index_id for c in decision.chosen]
    live = {
        i: (node_id, state)
        for i, node_id, state in Index.objects.select_for_update()
        .filter(id__in=ids)
        .values_list("id", "zoekt_node_id", "state")
    }
    keep = []
    for c in decision.chosen:
        node_id, state = live.get(c.index_id, (None, None))
        if node_id != decision.node_id:
            continue
        if decision.mode == p.SAFEGUARDS and state != Index.State.READY:
            continue
        keep.append(c)
    return keep, len(decision.chosen) - len(keep)


def _left_dark(replica_ids: list[int]) -> int:
    """How many namespaces these replicas leave without another ready replica."""
    if not replica_ids:
        return 0
    enabled_ids = set(
        Replica.objects.filter(id__in=replica_ids).values_list(
            "zoekt_enabled_namespace_id", flat=True
        )
    )
    still_served = set(
        Replica.objects.filter(
            zoekt_enabled_namespace_id__in=enabled_ids, state=Replica.State.READY
        )
        .exclude(id__in=replica_ids)
        .values_list("zoekt_enabled_namespace_id", flat=True)
    )
    return len(enabled_ids - still_served)


def _record_skipped(
    decision: p.Decision,
    node: Node | None,
    now: datetime,
    *,
    reason: str | None = None,
    changed: int = 0,
    **extra: Any,
) -> EvictionDecision:
    """A skipped decision; one that repeats the node's last one for its trigger is folded in."""
    reason = reason or decision.reason
    details = {**decision.details, **extra}
    if changed:
        details["changed_since_decided"] = changed
    last = (
        EvictionDecision.objects.select_for_update()
        .filter(node_id=decision.node_id, trigger=decision.trigger)
        .order_by("-id")
        .first()
    )
    if (
        last is not None
        and last.applied_at is None
        and last.reason == reason
        and last.mode == decision.mode
    ):
        EvictionDecision.objects.filter(id=last.id).update(
            repeats=F("repeats") + 1,
            last_seen_at=now,
            used_bytes=decision.used_bytes,
            total_bytes=decision.total_bytes,
            details=details,
        )
        last.refresh_from_db()
        return last
    return _new_row(decision, node, now, reason=reason, details=details)


def _new_row(decision: p.Decision, node: Node | None, now: datetime, **fields) -> EvictionDecision:
    return EvictionDecision.objects.create(
        created_at=now,
        last_seen_at=now,
        node=node,
        node_name=decision.node_name,
        trigger=decision.trigger,
        mode=decision.mode,
        used_bytes=decision.used_bytes,
        total_bytes=decision.total_bytes,
        projected_used_bytes=decision.projected_used_bytes,
        **fields,
    )


def _chosen_dict(c: p.Chosen) -> dict[str, Any]:
    out = {
        "index_id": c.index_id,
        "namespace_id": c.namespace_id,
        "replica_id": c.replica_id,
        "used_storage_bytes": c.used_storage_bytes,
        "reserved_storage_bytes": c.reserved_storage_bytes,
    }
    if c.target_node_id is not None:
        out["target_node_id"] = c.target_node_id
    return out


# --------------------------------------------------------------------------- #
# Cooldown
# --------------------------------------------------------------------------- #


def end_cooldowns(*, now: datetime | None = None) -> dict[str, int]:
    """End the cooldowns whose evicted indices are all gone, and close those that expired."""
    now = now or clock.now()
    ended = expired = 0
    open_rows = EvictionDecision.objects.filter(
        applied_at__isnull=False, cooldown_ended_at__isnull=True, mode=p.SAFEGUARDS
    ).select_related("node")
    for row in open_rows:
        node = row.node
        if node is None or node.eviction_cooldown_until is None:
            _close(row, now, Reason.COOLDOWN_EXPIRED)
            expired += 1
            continue
        if node.eviction_cooldown_until <= now:
            _close(row, now, Reason.COOLDOWN_EXPIRED)
            expired += 1
            continue
        if not Index.objects.filter(id__in=row.index_ids).exists():
            newer_open = (
                EvictionDecision.objects.filter(
                    node=node, applied_at__isnull=False, cooldown_ended_at__isnull=True
                )
                .exclude(id=row.id)
                .filter(index_ids__overlap=list(_live_index_ids(node)) or [-1])
                .exists()
            )
            _close(row, now, Reason.COOLDOWN_EVICTED_INDICES_GONE)
            if not newer_open:
                Node.objects.filter(id=node.id, eviction_cooldown_until__gt=now).update(
                    eviction_cooldown_until=None
                )
            ended += 1
    return {"cooldowns_ended": ended, "cooldowns_expired": expired}


def _live_index_ids(node: Node):
    return Index.objects.filter(zoekt_node=node).values_list("id", flat=True)


def _close(row: EvictionDecision, now: datetime, reason: str) -> None:
    EvictionDecision.objects.filter(id=row.id).update(
        cooldown_ended_at=now, cooldown_end_reason=reason
    )
