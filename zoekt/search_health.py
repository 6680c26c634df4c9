"""Search health: whether a node's processes are fit to answer searches.

GitLab's ``Search::Zoekt::ProcessHealth`` leaves a node out of search routing
when one of its processes is in trouble. This module is the same rule as pure
functions over a node's ``metadata`` and ``webserver_last_seen_at`` (no ORM,
no clock: ``now`` is passed in), so the queryset, the API and the tests share
one definition. A node is excluded for each of these reasons
(``zoekt.reasons.Reason``):

``webserver_stale``
    ``webserver_last_seen_at`` is NULL (the node never relayed its
    webserver's health) or older than the 30 s online threshold. A heartbeat
    stamps it only when it carries a ``process_health.webserver`` block.
``process_restarts_exceeded``
    ``restarts_15m`` of the indexer or of the webserver is *above* the
    ``zoekt_max_restarts_15m`` setting; equal is still fine, and 0 is strict.
``mmap_near_limit``
    ``mmap_current / mmap_max >= 0.95`` for the indexer or the webserver
    (an exact rational comparison). A ``mmap_max`` of 0 or less gives no
    signal.

A process that reports no metrics block is no signal for the last two rules.

The fleet gate: the rule applies only while every *online* node reports a
Zoekt version of at least ``MIN_VERSION`` (1.16.0), the release that sends
these counters; otherwise nobody is excluded by it. Offline nodes do not
count. Versions compare on their numeric ``major.minor.patch`` only, with an
optional leading ``v`` and any suffix after a ``-``, ``+``, ``.`` or ``_``
ignored: ``v1.16.2`` → (1, 16, 2), ``1.16.0-rc1`` → (1, 16, 0). A missing
or unparsable version (``1.16``, ``dev``) means the gate is not met.
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
# GitLab's threshold: the node online threshold.
WEBSERVER_STALE_SECONDS = capacity.ONLINE_DURATION_THRESHOLD_SECONDS
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
        (count := _count(process.get("restarts_15m"))) is not None and count > max_restarts
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


def webserver_stale(webserver_last_seen_at: datetime | None, now: datetime) -> bool:
    """Never seen, or seen before the online threshold (strictly older, as GitLab)."""
    if webserver_last_seen_at is None:
        return True
    return webserver_last_seen_at < now - timedelta(seconds=WEBSERVER_STALE_SECONDS)


def process_health_reasons(
    metadata: Mapping[str, Any] | None,
    webserver_last_seen_at: datetime | None,
    *,
    now: datetime,
    max_restarts: int,
) -> list[Reason]:
    """Every reason this node's processes are unfit for search; empty when healthy.

    The version gate is not applied here: see ``search_exclusions``.
    """
    metadata = metadata if isinstance(metadata, Mapping) else {}
    reasons: list[Reason] = []
    if webserver_stale(webserver_last_seen_at, now):
        reasons.append(Reason.WEBSERVER_STALE)
    if restarts_exceeded(metadata, max_restarts):
        reasons.append(Reason.PROCESS_RESTARTS_EXCEEDED)
    if mmap_near_limit(metadata):
        reasons.append(Reason.MMAP_NEAR_LIMIT)
    return reasons


def search_exclusions(
    online_nodes: Mapping[int, tuple[Mapping[str, Any] | None, datetime | None]],
    *,
    now: datetime,
    max_restarts: int,
) -> dict[int, list[Reason]]:
    """The online nodes the rule excludes, by id, with their reasons.

    ``online_nodes`` maps the id of every online node in the fleet to its
    ``(metadata, webserver_last_seen_at)``. When the fleet gate is not met the
    answer is empty.
    """
    versions = (
        metadata.get("version") if isinstance(metadata, Mapping) else None
        for metadata, _seen in online_nodes.values()
    )
    if not fleet_gate_met(versions):
        return {}
    excluded = {}
    for node_id, (metadata, seen) in online_nodes.items():
        reasons = process_health_reasons(metadata, seen, now=now, max_restarts=max_restarts)
        if reasons:
            excluded[node_id] = reasons
    return excluded
