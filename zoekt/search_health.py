"""Search health: whether a node's processes are fit to answer searches.

GitLab's ``Search::Zoekt::ProcessHealth`` leaves a node out of search routing
when one of its processes is in trouble. This module is the same rule as
pure functions over a node's ``metadata`` (no ORM, no clock: ``now`` is
passed in), so the queryset, the API and the tests share one definition.

A node is excluded for each of these reasons (``zoekt.reasons.Reason``):

``process_restarts_exceeded``
    ``process_health.indexer.restart_count`` or
    ``process_health.webserver.restart_count`` is *above* the
    ``zoekt_search_max_restarts`` setting (default 5). Equal to the setting
    is still fine; either process alone is enough to exclude the node.
``mmap_near_limit``
    ``mmap_current / mmap_max >= 0.95`` for the indexer or the webserver
    (exact rational comparison, so 0.95 is excluded and 0.9499 is not).
    A process that reports no ``mmap_max``, or 0, gives no signal.
``webserver_stale``
    ``metadata.webserver_last_seen_at`` is ``WEBSERVER_STALE_SECONDS`` (60 s,
    twice the 30 s online threshold) or more in the past. A heartbeat stamps
    that time only when it carries a webserver block, so a node whose
    heartbeats keep it online while its webserver has stopped reporting
    becomes stale after two online windows. Exactly 60 s is stale, the same
    way a node seen exactly 30 s ago is offline.

Missing data is no signal, never an exclusion: a node that sends no
``process_health`` block, no counter, or no ``webserver_last_seen_at``
(or one that does not parse) is not excluded for it. The rule is a reactive
exclusion of a node known to be in trouble; turning a telemetry gap into a
search outage would be worse than the trouble it guards against.

The fleet gate: the rule applies only while every *online* node reports a
Zoekt version of at least ``MIN_VERSION`` (1.16.0), the release that sends
these counters; otherwise nobody is excluded by it. Offline nodes do not
count. Versions compare on their numeric ``major.minor.patch`` only, with an
optional leading ``v`` and any suffix after a ``-``, ``+``, ``.`` or ``_``
ignored: ``v1.16.2`` → (1, 16, 2), ``1.16.0-rc1`` → (1, 16, 0) (so a
1.16.0 release candidate meets the gate), ``v2025.01.01-abc`` →
(2025, 1, 1). A missing or unparsable version (``1.16``, ``dev``) means the
gate is not met: the fleet cannot be shown to report the counters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from zoekt import capacity
from zoekt.reasons import Reason

MIN_VERSION: tuple[int, int, int] = (1, 16, 0)
MMAP_NEAR_LIMIT_RATIO = Fraction(95, 100)
# Twice the online threshold: a webserver may miss one heartbeat window, not two.
WEBSERVER_STALE_SECONDS = 2 * capacity.ONLINE_DURATION_THRESHOLD_SECONDS
PROCESSES = ("indexer", "webserver")

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[-+._].*)?$")


def parse_version(value: Any) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a reported version, or None when it does not parse."""
    if not isinstance(value, str):
        return None
    match = _VERSION.match(value.strip())
    if not match:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def version_meets_minimum(value: Any) -> bool:
    parsed = parse_version(value)
    return parsed is not None and parsed >= MIN_VERSION


def fleet_gate_met(online_versions: Iterable[Any]) -> bool:
    """True when every online node's version is at least ``MIN_VERSION``.

    Pass the versions of the online nodes only; offline nodes do not block
    the gate. With no online node it is vacuously met (and nothing is
    searchable anyway).
    """
    return all(version_meets_minimum(version) for version in online_versions)


def _count(value: Any) -> int | None:
    """A non-negative integer counter, or None for anything else (bools included)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _processes(metadata: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    health = metadata.get("process_health")
    if not isinstance(health, Mapping):
        return []
    return [health[name] for name in PROCESSES if isinstance(health.get(name), Mapping)]


def restarts_exceeded(metadata: Mapping[str, Any], max_restarts: int) -> bool:
    return any(
        (count := _count(process.get("restart_count"))) is not None and count > max_restarts
        for process in _processes(metadata)
    )


def mmap_near_limit(metadata: Mapping[str, Any]) -> bool:
    for process in _processes(metadata):
        current = _count(process.get("mmap_current"))
        maximum = _count(process.get("mmap_max"))
        if current is None or not maximum:
            continue
        if Fraction(current, maximum) >= MMAP_NEAR_LIMIT_RATIO:
            return True
    return False


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def webserver_stale(metadata: Mapping[str, Any], now: datetime) -> bool:
    seen = _parse_time(metadata.get("webserver_last_seen_at"))
    if seen is None:
        return False
    return seen <= now - timedelta(seconds=WEBSERVER_STALE_SECONDS)


def process_health_reasons(
    metadata: Mapping[str, Any] | None, *, now: datetime, max_restarts: int
) -> list[Reason]:
    """Every reason this node's processes are unfit for search; empty when healthy.

    The version gate is not applied here: see ``search_exclusions``.
    """
    metadata = metadata if isinstance(metadata, Mapping) else {}
    reasons: list[Reason] = []
    if restarts_exceeded(metadata, max_restarts):
        reasons.append(Reason.PROCESS_RESTARTS_EXCEEDED)
    if mmap_near_limit(metadata):
        reasons.append(Reason.MMAP_NEAR_LIMIT)
    if webserver_stale(metadata, now):
        reasons.append(Reason.WEBSERVER_STALE)
    return reasons


def search_exclusions(
    online_metadata: Mapping[int, Mapping[str, Any] | None],
    *,
    now: datetime,
    max_restarts: int,
) -> dict[int, list[Reason]]:
    """The online nodes the rule excludes, by id, with their reasons.

    ``online_metadata`` maps the id of every online node in the fleet to its
    metadata. When the fleet gate is not met the answer is empty.
    """
    versions = (
        metadata.get("version") if isinstance(metadata, Mapping) else None
        for metadata in online_metadata.values()
    )
    if not fleet_gate_met(versions):
        return {}
    excluded = {}
    for node_id, metadata in online_metadata.items():
        reasons = process_health_reasons(metadata, now=now, max_restarts=max_restarts)
        if reasons:
            excluded[node_id] = reasons
    return excluded
