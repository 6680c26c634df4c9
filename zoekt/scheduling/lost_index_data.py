"""Nodes that lost their index data under the same uuid: notice them and re-index.

A node that loses its disk but keeps its uuid (a rebuilt volume, a restored
machine, a fake node restarted without its holdings) heartbeats as the same
row: the heartbeat is not a registration, so it is not told to truncate, and
it is not lost, so lost-node handling leaves it alone. Without this check its
indices would stay ``ready`` and searchable while the node holds nothing.

The rule (docs/scheduling.md, *Lost index data*), checked every minute over
the online search nodes but those an operator is restarting within the
allowed delay (``Node.objects.in_restart``, docs/operations.md: their record
settles on the same shortfall rule, ``zoekt.shutdowns``):

* **expected** is the sum of ``used_storage_bytes`` of the node's ``ready``
  indices; **reported** is its last heartbeat's ``disk.indexed``
  (``indexed_bytes``);
* a reading is a **shortfall** when reported < ``SHORTFALL_RATIO`` (½) ×
  expected and expected − reported ≥ ``MIN_MISSING_BYTES`` (16 MiB);
* a node is **armed** once a check sees it *healthy*: expected ≥
  ``MIN_MISSING_BYTES`` and reported ≥ ½ × expected. Only an armed node is
  re-indexed, and a re-index disarms it until it reports its bytes again, so
  a node that never sends ``disk.indexed`` (optional in GitLab's API) is
  never re-indexed, and one whose figure stays wrong is re-indexed once, not
  in a loop;
* an armed node is re-indexed when a shortfall, first seen at one check, is
  still there at a check ``SUSTAIN_SECONDS`` (2 min) later or more, *and* a
  newer heartbeat than the first one reported it. Any check without a
  shortfall forgets the first sighting. Before re-indexing, the shortfall is
  confirmed against the sum of ``size_bytes`` of the ready repositories of
  those indices, which the callbacks keep current (``used_storage_bytes`` is
  refreshed by a later pass and can lag behind them).

A re-index uses the existing state machine: the node's ``ready`` indices go
back to ``initializing`` and their ``ready`` repositories to ``pending``;
their ``ready`` replicas go back to ``pending`` (as ``update_replica_states``
would on its next tick), so ``search_targets`` stops routing to them at
once. ``repo_to_index_check`` then hands the repositories to the node as
index tasks, the callbacks make them ready, and ``mark_indices_as_ready``
and ``update_replica_states`` bring the indices and replicas back.

The state lives in the node's ``metadata`` under ``indexed_bytes_check``
(``armed``, ``shortfall_since``, ``shortfall_heartbeat_at`` and the last
re-index, ``last_reindex``, with its reason code); the heartbeat merges its
own keys over the stored ones, so it survives heartbeats. It is written only
when it changes. Each write claims the node row (``FOR UPDATE SKIP
LOCKED``) and decides again on the fresh row, so two runs at once re-index
a node once.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime
from typing import Any

from celery import shared_task
from django.db import transaction
from django.db.models import Sum

from zoekt import app_settings, clock, transitions
from zoekt.logging import get_logger
from zoekt.models import Index, Node, Replica, Repository
from zoekt.reasons import Reason

log = get_logger(__name__)

MIB = 1024**2

SHORTFALL_RATIO = 0.5
MIN_MISSING_BYTES = 16 * MIB
SUSTAIN_SECONDS = 120
METADATA_KEY = "indexed_bytes_check"

# Beat's interval for the check (``reindex-lost-index-data`` in ``zoekt.scheduling.beat``).
CHECK_INTERVAL_SECONDS = 60

# What one check decided for one node.
HEALTHY = "healthy"  # reports at least half of a meaningful expected figure: armed
NOT_JUDGED = "not_judged"  # no shortfall, but too little ready to call it healthy
NOT_ARMED = "not_armed"  # a shortfall on a node never seen healthy (or since its last re-index)
SHORTFALL_SEEN = "shortfall_seen"  # the first sighting is recorded
SHORTFALL_WAITING = "shortfall_waiting"  # seen before, not yet for long enough
REINDEX = "reindex"
NOT_CONFIRMED = "not_confirmed"  # the repositories' own sizes do not show the shortfall
NODE_IN_RESTART = "node_in_restart"  # an operator is restarting it: left alone (re-checked)


def is_shortfall(reported_bytes: int, expected_bytes: int) -> bool:
    """Far fewer bytes than expected: below the ratio, and by at least the minimum."""
    return (
        reported_bytes < expected_bytes * SHORTFALL_RATIO
        and expected_bytes - reported_bytes >= MIN_MISSING_BYTES
    )


def is_healthy(reported_bytes: int, expected_bytes: int) -> bool:
    """Enough is ready to judge, and the node reports at least the ratio of it."""
    return (
        expected_bytes >= MIN_MISSING_BYTES and reported_bytes >= expected_bytes * SHORTFALL_RATIO
    )


@dataclasses.dataclass(frozen=True)
class Reading:
    """One node at one check: what it reported, when, and what its ready indices hold."""

    reported_bytes: int
    expected_bytes: int
    last_seen_at: datetime


def decide(reading: Reading, state: dict, now: datetime) -> tuple[str, dict]:
    """The decision for one node and its new ``indexed_bytes_check`` state (pure)."""
    state = dict(state)
    if not is_shortfall(reading.reported_bytes, reading.expected_bytes):
        state.pop("shortfall_since", None)
        state.pop("shortfall_heartbeat_at", None)
        if is_healthy(reading.reported_bytes, reading.expected_bytes):
            state["armed"] = True
            return HEALTHY, state
        return NOT_JUDGED, state
    if not state.get("armed"):
        return NOT_ARMED, state
    since = _parse(state.get("shortfall_since"))
    first_heartbeat = _parse(state.get("shortfall_heartbeat_at"))
    if since is None or first_heartbeat is None:
        state["shortfall_since"] = now.isoformat()
        state["shortfall_heartbeat_at"] = reading.last_seen_at.isoformat()
        return SHORTFALL_SEEN, state
    sustained = (now - since).total_seconds() >= SUSTAIN_SECONDS
    if sustained and reading.last_seen_at > first_heartbeat:
        return REINDEX, state
    return SHORTFALL_WAITING, state


def _parse(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _expected_bytes(node_ids: list[int]) -> dict[int, int]:
    rows = (
        Index.objects.filter(zoekt_node_id__in=node_ids, state=Index.State.READY)
        .values("zoekt_node_id")
        .annotate(total=Sum("used_storage_bytes"))
        .values_list("zoekt_node_id", "total")
    )
    return {node_id: int(total or 0) for node_id, total in rows}


def _held_bytes(node_id: int) -> int:
    """What the node's ready indices hold by their ready repositories' own sizes."""
    total = Repository.objects.filter(
        zoekt_index__zoekt_node_id=node_id,
        zoekt_index__state=Index.State.READY,
        state=Repository.State.READY,
    ).aggregate(total=Sum("size_bytes"))["total"]
    return int(total or 0)


def check_lost_index_data(now: datetime | None = None) -> dict[str, Any]:
    """Run the check once over the online search nodes; returns what it found and did."""
    now = now or clock.now()
    nodes = list(
        Node.objects.for_search()
        .online(now)
        .not_in_restart(now)
        .order_by("id")
        .values_list("id", "indexed_bytes", "last_seen_at", "metadata")
    )
    expected = _expected_bytes([row[0] for row in nodes])
    decisions: Counter = Counter()
    reindexed: list[dict[str, Any]] = []
    for node_id, reported, last_seen_at, metadata in nodes:
        state = (metadata or {}).get(METADATA_KEY) or {}
        reading = Reading(int(reported or 0), expected.get(node_id, 0), last_seen_at)
        decision, new_state = decide(reading, state, now)
        if decision != REINDEX and new_state == state:
            decisions[decision] += 1
            continue
        decision, done = _apply(node_id, now)
        decisions[decision] += 1
        if done is not None:
            reindexed.append(done)
    return {
        "nodes_checked": len(nodes),
        "decisions": dict(sorted(decisions.items())),
        "reindexed": dict(Counter(str(item["reason"]) for item in reindexed)),
        "nodes_reindexed": reindexed,
        "indices_reindexed": sum(item["indices_reindexed"] for item in reindexed),
        "repositories_reset": sum(item["repositories_reset"] for item in reindexed),
    }


def _apply(node_id: int, now: datetime) -> tuple[str, dict[str, Any] | None]:
    """Decide again on the claimed node row and write the outcome; re-index when it says so."""
    with transaction.atomic():
        node = Node.objects.select_for_update(skip_locked=True).filter(pk=node_id).first()
        if node is None or not node.is_online(now):
            return "node_claimed_or_gone", None
        if Node.objects.filter(pk=node.id).in_restart(now).exists():
            return NODE_IN_RESTART, None
        state = node.metadata.get(METADATA_KEY) or {}
        reading = Reading(
            node.indexed_bytes, _expected_bytes([node.id]).get(node.id, 0), node.last_seen_at
        )
        decision, new_state = decide(reading, state, now)
        done = None
        if decision == REINDEX:
            held = _held_bytes(node.id)
            if is_shortfall(node.indexed_bytes, held):
                done = _reindex(node, reading, held, now)
                new_state = {
                    "armed": False,
                    "last_reindex": {
                        "at": now.isoformat(),
                        "reason": str(Reason.INDEXED_BYTES_SHORTFALL),
                        "reported_bytes": node.indexed_bytes,
                        "expected_bytes": reading.expected_bytes,
                        "held_bytes": held,
                        "indices": done["indices_reindexed"],
                        "repositories": done["repositories_reset"],
                    },
                }
            else:
                decision = NOT_CONFIRMED
                new_state.pop("shortfall_since", None)
                new_state.pop("shortfall_heartbeat_at", None)
        if new_state != state:
            # No updated_at: the heartbeat's 5 s debounce reads it.
            Node.objects.filter(pk=node.id).update(
                metadata={**node.metadata, METADATA_KEY: new_state}
            )
    return decision, done


def _reindex(node: Node, reading: Reading, held: int, now: datetime) -> dict[str, Any]:
    """The node's ready indices back to initializing, their ready repositories to pending."""
    index_ids = list(
        Index.objects.filter(zoekt_node_id=node.id, state=Index.State.READY).values_list(
            "id", flat=True
        )
    )
    replicas = Replica.objects.filter(
        state=Replica.State.READY,
        id__in=Index.objects.filter(id__in=index_ids).values("zoekt_replica_id"),
    ).update(state=Replica.State.PENDING)
    indices = transitions.mark_indices_initializing(
        Index.objects.filter(id__in=index_ids, state=Index.State.READY), now=now
    )
    repositories = transitions.mark_repositories_pending(
        Repository.objects.filter(zoekt_index_id__in=index_ids, state=Repository.State.READY),
        now=now,
    )
    done = {
        "node_id": node.id,
        "node_name": node.name,
        "reason": Reason.INDEXED_BYTES_SHORTFALL,
        "reported_bytes": node.indexed_bytes,
        "expected_bytes": reading.expected_bytes,
        "held_bytes": held,
        "indices_reindexed": indices,
        "repositories_reset": repositories,
        "replicas_marked_pending": replicas,
    }
    log.warning("node_index_data_lost", **done)
    return done


@shared_task(name="zoekt.reindex_lost_index_data")
def reindex_lost_index_data_task() -> dict:
    """Re-index the nodes that lost their index data under the same uuid (one log line)."""
    skipped = app_settings.current().indexing_gate
    result = {"skipped": skipped} if skipped is not None else check_lost_index_data()
    log.info("reindex_lost_index_data", **result)
    return result
