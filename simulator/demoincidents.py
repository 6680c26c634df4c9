"""Incidents for a running ``make demo``: what ``manage.py zoekt_demo_incident`` does.

Each incident makes one of the product's features happen on the demo's fleet,
in a couple of minutes, and says when it is over:

* ``spike``: a node's disk goes to 80 % for 45 s with temporary data that
  clears by itself; node-level eviction (enabled, sustain period 2 min) sees it
  and does not evict: skipped decisions, ``eviction_sustain_not_reached``.
* ``overfill``: a node's disk goes to 78 % and stays there; after the sustain
  period (1 min) node-level eviction moves indices off it, each built elsewhere
  while the old copy serves.
* ``hot``: one namespace's resident memory grows on its node until the node is
  at 80 % of its memory budget; after the sustain period (1 min) the
  memory-pressure rule moves the node's hottest namespace to a node with room.
* ``drain``: the ``zoekt_node remove`` request on one node; the drain job
  moves every index off it, then the node is returned to service.

The fake nodes are other processes: the incident reaches them through each
node's override file (``simulator.fakenode.NodeOverride``, under the fake
nodes' state directory), read again on every heartbeat. Settings an incident
needs (node-level eviction on, a sustain period of seconds rather than 8
hours, ...) are changed for its duration, printed, and put back at the end.

Beat runs the eviction jobs every one to five minutes; like the demo driver,
an incident runs a pass every 2 s in its own process instead: the scheduling
pass (``zoekt_demo_drive.run_scheduling_pass``) and then the eviction jobs
(node-level eviction when enabled, memory pressure, drains, moves, cooldowns),
each under its usual lock. Every pass also asks search for every enabled
namespace and counts the ones with no target: the incidents promise none.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from simulator.fakenode import NodeOverride, override_path, write_override

DASHBOARD = "http://127.0.0.1:8000/admin/dashboard/"
INCIDENTS = ("spike", "overfill", "hot", "drain")

#: Disk (share of the node's disk) and memory (share of its budget) targets, below the
#: critical watermark (85 %) so the sustain period decides, not the critical rule.
SPIKE_PERCENT = 0.80
SPIKE_SECONDS = 45
OVERFILL_PERCENT = 0.78
HOT_PERCENT = 0.80
HOT_RAMP_SECONDS = 20.0
#: The demo's sustain periods (the setting's shortest unit is the minute): the spike
#: clears well within its own, the overfill and the hot namespace outlast theirs.
SPIKE_SUSTAIN = "2m"
SUSTAIN = "1m"
SUSTAIN_SECONDS = 60
#: A hot namespace that no node can take gives up after this long past the sustain.
HOT_NO_TARGET_GRACE_SECONDS = 60
#: How long the hot incident waits, at its end, for its node to report its memory back.
SETTLE_SECONDS = 15


class IncidentError(Exception):
    """An incident cannot start (no such node, no node online, ...): nothing was changed."""


def fill_bytes(used: int, total: int, share: float) -> int:
    """The bytes to add to a disk at ``used`` of ``total`` to bring it to ``share``."""
    return max(int(share * total) - used, 0)


def gib(value: int | float) -> str:
    return f"{value / 1024**3:.2f} GiB"


# --- settings ---------------------------------------------------------------------------------


@dataclasses.dataclass
class SettingsChange:
    """Columns of the settings row set for an incident, and put back after it."""

    values: dict[str, Any]
    before: dict[str, Any] = dataclasses.field(default_factory=dict)

    def apply(self) -> list[str]:
        from zoekt import app_settings

        row = app_settings.load_row()
        self.before = {name: getattr(row, name) for name in self.values}
        changed = {n: v for n, v in self.values.items() if self.before[n] != v}
        if changed:
            app_settings.update(validate=True, **changed)
        return [f"{name}: {self.before[name]!r} -> {value!r}" for name, value in changed.items()]

    def restore(self) -> list[str]:
        from zoekt import app_settings

        row = app_settings.load_row()
        back = {n: v for n, v in self.before.items() if getattr(row, n) != v}
        if back:
            app_settings.update(**back)
        return [f"{name}: back to {value!r}" for name, value in back.items()]


# --- the pass ---------------------------------------------------------------------------------


def run_incident_pass() -> dict[str, Any]:
    """One pass at the demo's pace: the scheduling pass, then the eviction jobs in-process."""
    from eviction import tasks
    from simulator.management.commands.zoekt_demo_drive import run_scheduling_pass
    from zoekt import app_settings

    results: dict[str, Any] = {"scheduling": run_scheduling_pass()}
    if app_settings.current().node_level_eviction_enabled:
        results["node_level"] = tasks.evict_from_nodes_task()
    results["memory_pressure"] = tasks.memory_pressure_task()
    results["drain"] = tasks.drain_nodes_task()
    results["moves"] = tasks.advance_moves_task()
    results["cooldowns"] = tasks.end_cooldowns_task()
    return results


def dark_namespaces() -> set[int]:
    """The enabled, searched namespaces a search would find no target for now."""
    from simulator.management.commands.zoekt_demo_traffic import (
        dark_reasons,
        enabled_namespace_ids,
    )

    ids = enabled_namespace_ids()
    return {ns for ns, reason in dark_reasons(ids).items() if reason} if ids else set()


# --- picking ----------------------------------------------------------------------------------


def online_nodes(now: datetime | None = None) -> list:
    from zoekt import clock
    from zoekt.models import Node

    now = now or clock.now()
    return list(Node.objects.for_search().online(now).not_in_shutdown(now).order_by("id"))


def pick_node(ref: str | None, rank: Callable[[Any], Any]) -> Any:
    """The node named (id or name), else the online search node ``rank`` puts first."""
    from zoekt import shutdowns
    from zoekt.operator_actions import OperatorError

    if ref:
        try:
            return shutdowns.find_node(ref)
        except OperatorError as error:
            raise IncidentError(f"no node {ref!r}") from error
    nodes = online_nodes()
    if not nodes:
        raise IncidentError("no search node is online: is `make demo` running?")
    return min(nodes, key=rank)


def index_count(node) -> int:
    from zoekt.models import Index

    return Index.objects.filter(zoekt_node=node).count()


def node_rss(node) -> tuple[int | None, int | None]:
    """(webserver RSS, memory budget) as the node last reported them."""
    from zoekt import app_settings, memory

    metadata = node.metadata or {}
    budget, _ = memory.memory_budget(metadata, app_settings.current().node_memory_budget_bytes)
    return memory.webserver_counter(metadata, "rss_bytes"), budget


def seconds_since(moment: datetime | None, now: datetime) -> int | None:
    return None if moment is None else max(int((now - moment).total_seconds()), 0)


def moves_text(moves) -> str:
    """``done 2 · building 1`` over the moves given."""
    counts: dict[str, int] = {}
    for move in moves:
        counts[move.state] = counts.get(move.state, 0) + 1
    return " · ".join(f"{state} {count}" for state, count in sorted(counts.items())) or "none"


def move_lines(moves) -> list[str]:
    lines = []
    for move in moves:
        took = ""
        if move.done_at is not None:
            took = f" in {int((move.done_at - move.created_at).total_seconds())} s"
        target = move.target_node.name if move.target_node else "-"
        source = move.source_node.name if move.source_node else "-"
        lines.append(
            f"  move {move.id} ({move.trigger}): index {move.source_index_ref} of namespace "
            f"{move.namespace_id}, {gib(move.bytes)}, {source} -> {target}: {move.state}{took}"
            + (f" ({move.reason})" if move.reason else "")
        )
    return lines


# --- the incidents ----------------------------------------------------------------------------


@dataclasses.dataclass
class Incident:
    """One incident on one node: ``start``, then ``check`` after each pass, then ``finish``."""

    node: Any
    state_dir: Path
    settings: SettingsChange = dataclasses.field(default_factory=lambda: SettingsChange({}))
    started_at: datetime | None = None
    started_wall: float = 0.0
    written: list[Path] = dataclasses.field(default_factory=list)

    name = "incident"
    watch = DASHBOARD
    #: Whether it needs move targets, and so the memory ratio calibrated (see
    #: ``calibrate_memory_ratio``).
    calibrate = True

    def begin(self) -> list[str]:
        from zoekt import clock

        self.started_at = clock.now()
        self.started_wall = time.time()
        if self.calibrate:
            self.settings.values["zoekt_memory_auto_calibration"] = True
        lines = self.settings.apply()
        if self.calibrate:
            lines.append(self.calibrate_memory_ratio())
        changed = (
            ["settings changed for the incident (put back at its end):"]
            + [f"  {line}" for line in lines]
            if lines
            else []
        )
        return changed + self.start() + [f"watch: {self.watch}"]

    def calibrate_memory_ratio(self) -> str:
        """Set ``memory_ratio`` from the nodes' observed RSS, as auto-calibration does hourly.

        A move needs a target whose memory estimate, with the index's, stays under the
        high memory watermark of its budget. The demo plans at the seed's ratio (0.5),
        about twice what its nodes hold resident, which puts every node's estimate near
        80 % of its 2 GiB: no node could take anything. Calibrated, the estimates are what
        the nodes hold. Put back at the end with the other settings.
        """
        from zoekt import memory

        calibration = memory.calibrate_memory_ratio()
        self.settings.before.setdefault("zoekt_memory_ratio", calibration.memory_ratio_before)
        return (
            f"zoekt_memory_ratio: {calibration.memory_ratio_before!r} -> "
            f"{calibration.memory_ratio_after!r} (calibrated from {calibration.samples} nodes' "
            "observed RSS, as zoekt_memory_auto_calibration does hourly: at 0.5 every demo "
            "node's memory estimate is about 80 % of its budget and no node could take a move)"
        )

    def start(self) -> list[str]:
        raise NotImplementedError

    def check(self, results: dict[str, Any]) -> tuple[bool, str]:
        """(over, one progress line) after a pass whose job results are ``results``."""
        raise NotImplementedError

    def summary(self) -> list[str]:
        return []

    def finish(self) -> list[str]:
        lines = []
        for path in self.written:
            write_override(path, None)
            lines.append(f"removed {path}: the node reports what it holds again")
        self.written.clear()
        lines += [f"settings: {line}" for line in self.settings.restore()]
        return lines

    def override(self, node, value: NodeOverride) -> Path:
        path = override_path(self.state_dir, node.name)
        write_override(path, value)
        if path not in self.written:
            self.written.append(path)
        return path

    def fresh(self):
        """The incident's node as the database has it now."""
        return type(self.node).objects.get(pk=self.node.pk)

    def elapsed(self) -> int:
        return int(time.time() - self.started_wall)

    def decisions(self):
        from eviction.models import EvictionDecision

        return EvictionDecision.objects.filter(
            node_id=self.node.pk, last_seen_at__gte=self.started_at
        ).order_by("id")


class DiskIncident(Incident):
    share = OVERFILL_PERCENT
    seconds: int | None = None
    sustain = SUSTAIN

    def __init__(self, node, state_dir: Path) -> None:
        super().__init__(
            node,
            state_dir,
            SettingsChange(
                {
                    "zoekt_node_level_eviction_enabled": True,
                    "zoekt_eviction_sustain_period": self.sustain,
                }
            ),
        )

    watch = f"{DASHBOARD}evictions/ (decisions) and {DASHBOARD}moves/ (moves)"

    def start(self) -> list[str]:
        node = self.fresh()
        extra = fill_bytes(node.used_bytes, node.total_bytes, self.share)
        until = None if self.seconds is None else time.time() + self.seconds
        note = f"zoekt_demo_incident {self.name}"
        path = self.override(node, NodeOverride(extra_disk_bytes=extra, until=until, note=note))
        lasting = f"for {self.seconds} s, then it clears" if self.seconds else "until the end"
        return [
            f"{node.name}: disk {node.used_bytes / node.total_bytes:.0%} used; {gib(extra)} "
            f"of other files added ({path}), {self.share:.0%} {lasting}",
        ]

    def disk_text(self) -> str:
        node = self.fresh()
        share = node.used_bytes / node.total_bytes if node.total_bytes else 0.0
        over = seconds_since(node.high_watermark_exceeded_at, clock_now())
        return f"{node.name} disk {share:.0%}" + (
            f", over the high watermark for {over} s" if over is not None else ""
        )

    def decision_text(self) -> str:
        rows = list(self.decisions())
        if not rows:
            return "no decision yet"
        return ", ".join(
            f"{d.reason}" + (" (applied)" if d.applied_at else f" ×{d.repeats}") for d in rows
        )


def clock_now() -> datetime:
    from zoekt import clock

    return clock.now()


class Spike(DiskIncident):
    name = "spike"
    calibrate = False  # nothing moves
    share = SPIKE_PERCENT
    seconds = SPIKE_SECONDS
    sustain = SPIKE_SUSTAIN

    def check(self, results: dict[str, Any]) -> tuple[bool, str]:
        node = self.fresh()
        cleared = self.elapsed() > SPIKE_SECONDS and node.high_watermark_exceeded_at is None
        return cleared, f"{self.disk_text()}; decisions: {self.decision_text()}"

    def summary(self) -> list[str]:
        rows = list(self.decisions())
        applied = [d for d in rows if d.applied_at]
        skipped = [f"{d.reason} (seen {d.repeats} times)" for d in rows if not d.applied_at]
        return [
            f"over: the spike cleared by itself; decisions skipped: {', '.join(skipped) or 'none'}"
            f"; applied: {len(applied)}" + ("" if applied else ": nothing was evicted"),
        ]


class Overfill(DiskIncident):
    name = "overfill"

    def moves(self):
        from zoekt.models import Move

        applied = [d.id for d in self.decisions() if d.applied_at]
        return list(
            Move.objects.filter(decision_id__in=applied)
            .select_related("source_node", "target_node")
            .order_by("id")
        )

    def check(self, results: dict[str, Any]) -> tuple[bool, str]:
        from zoekt.models import Move

        moves = self.moves()
        over = bool(moves) and not any(m.state in Move.LIVE for m in moves)
        return over, (
            f"{self.disk_text()}; decisions: {self.decision_text()}; moves: {moves_text(moves)}"
        )

    def summary(self) -> list[str]:
        moves = self.moves()
        return [f"over: {len(moves)} move(s) off {self.node.name}:", *move_lines(moves)]


class Hot(Incident):
    name = "hot"
    watch = f"{DASHBOARD}moves/ (the move) and {DASHBOARD} (the fleet's memory column)"

    def __init__(self, node, state_dir: Path, namespace_id: int | None = None) -> None:
        super().__init__(
            node,
            state_dir,
            SettingsChange(
                {
                    "zoekt_memory_pressure_moves": True,
                    "zoekt_eviction_sustain_period": SUSTAIN,
                }
            ),
        )
        self.namespace_id = namespace_id
        self.extra = 0

    def start(self) -> list[str]:
        from zoekt.models import Index

        rss, budget = node_rss(self.fresh())
        if not rss or not budget:
            raise IncidentError(f"{self.node.name} reports no webserver RSS or memory budget")
        indices = Index.objects.filter(zoekt_node=self.node, state=Index.State.READY)
        if self.namespace_id is None:
            self.namespace_id = hottest_candidate(indices)
            if self.namespace_id is None:
                raise IncidentError(f"{self.node.name} holds no ready index that may move")
        elif not indices.filter(zoekt_enabled_namespace__root_namespace_id=self.namespace_id):
            raise IncidentError(f"{self.node.name} holds no ready index of {self.namespace_id}")
        self.extra = fill_bytes(rss, budget, HOT_PERCENT)
        return [
            f"{self.node.name}: webserver RSS {gib(rss)} of {gib(budget)} "
            f"({rss / budget:.0%}); namespace {self.namespace_id}'s resident memory grows "
            f"by {gib(self.extra)} over {HOT_RAMP_SECONDS:.0f} s, to {HOT_PERCENT:.0%}",
        ]

    def ramp(self) -> None:
        share = min(self.elapsed() / HOT_RAMP_SECONDS, 1.0)
        grown = int(self.extra * share)
        self.override(
            self.node,
            NodeOverride(
                extra_rss_bytes={self.namespace_id: grown}, note="zoekt_demo_incident hot"
            ),
        )

    def moves(self):
        from zoekt.models import Move

        return list(
            Move.objects.filter(
                trigger="memory_pressure",
                created_at__gte=self.started_at,
                source_node_id=self.node.pk,
            )
            .select_related("source_node", "target_node")
            .order_by("id")
        )

    def check(self, results: dict[str, Any]) -> tuple[bool, str]:
        from zoekt.models import Move

        self.ramp()
        node = self.fresh()
        rss, budget = node_rss(node)
        share = f"{rss / budget:.0%}" if rss and budget else "?"
        over_for = seconds_since(node.memory_high_watermark_exceeded_at, clock_now())
        moves = self.moves()
        pressure = results.get("memory_pressure") or {}
        reasons = sorted({c.get("reason") for c in pressure.get("choices", []) if c})
        text = (
            f"{node.name} memory {share} of its budget"
            + (f", over the high watermark for {over_for} s" if over_for is not None else "")
            + (f"; memory pressure: {', '.join(map(str, reasons))}" if reasons else "")
            + f"; moves: {moves_text(moves)}"
        )
        done = bool(moves) and not any(m.state in Move.LIVE for m in moves)
        stuck = (
            not moves
            and "memory_pressure_no_target" in reasons
            and self.elapsed() > HOT_RAMP_SECONDS + SUSTAIN_SECONDS + HOT_NO_TARGET_GRACE_SECONDS
        )
        return done or stuck, text

    def finish(self) -> list[str]:
        lines = super().finish()
        # Wait for the node's next heartbeats to report its memory without the growth, so
        # the next incident (which may calibrate from the RSS reported) sees the real figure.
        deadline = time.time() + SETTLE_SECONDS
        while True:
            rss, budget = node_rss(self.fresh())
            if rss is None or not budget or rss < budget * HOT_PERCENT * 0.95:
                break
            if time.time() >= deadline:
                lines.append(f"{self.node.name} still reports {rss / budget:.0%} of its budget")
                return lines
            time.sleep(1.0)
        if rss is not None and budget:
            lines.append(f"{self.node.name} reports {rss / budget:.0%} of its memory budget again")
        return lines

    def summary(self) -> list[str]:
        moves = self.moves()
        if not moves:
            return [
                "over: no node could take the hot namespace (memory_pressure_no_target); the "
                f"operator's tool is the re-split: manage.py zoekt_move --resplit "
                f"{self.namespace_id}"
            ]
        head = f"over: {len(moves)} memory-pressure move(s) off {self.node.name}:"
        return [head, *move_lines(moves)]


def hottest_candidate(indices) -> int | None:
    """The root namespace the memory-pressure rule would move first off these indices: the
    largest estimate (repository bytes), leaving out a namespace moving now or moved in the
    last 24 hours (``eviction.memory_policy``), so the namespace that grows is the one moved."""
    from datetime import timedelta

    from django.db.models import Q

    from eviction.memory_policy import MOVED_RECENTLY_SECONDS
    from zoekt import memory
    from zoekt.models import Move

    since = clock_now() - timedelta(seconds=MOVED_RECENTLY_SECONDS)
    recently = Move.objects.filter(Q(state__in=Move.LIVE) | Q(done_at__gte=since))
    rows = list(
        indices.exclude(
            zoekt_enabled_namespace_id__in=recently.values("zoekt_enabled_namespace_id")
        ).values_list("id", "zoekt_enabled_namespace__root_namespace_id")
    )
    sizes = memory.repository_bytes_by_index([index_id for index_id, _ in rows])
    ranked = sorted(rows, key=lambda row: (-sizes.get(row[0], 0), row[0]))
    return ranked[0][1] if ranked else None


class Drain(Incident):
    name = "drain"
    watch = f"{DASHBOARD}maintenance/ (the drain) and {DASHBOARD}moves/ (its moves)"
    record = None

    def start(self) -> list[str]:
        from zoekt import shutdowns
        from zoekt.audit import Actor

        self.record = shutdowns.do_request_node_shutdown(
            self.node.pk,
            type="remove",
            reason="demo incident: drain",
            requested_by="zoekt_demo_incident",
            actor=Actor.command("zoekt_demo_incident"),
        )
        return [
            f"{self.node.name}: drain requested (zoekt_node remove {self.node.name}), "
            f"{index_count(self.node)} indices to move off it"
        ]

    def describe(self) -> dict[str, Any]:
        from zoekt import shutdowns
        from zoekt.models import NodeShutdown

        self.record = NodeShutdown.objects.get(pk=self.record.pk)
        return shutdowns.describe(self.record)

    def check(self, results: dict[str, Any]) -> tuple[bool, str]:
        from zoekt.models import Move

        described = self.describe()
        drain = described["drain"] or {}
        # Stalled (an index no node can take) is over once its other moves are: the index
        # keeps serving where it is.
        live = any(move.state in Move.LIVE for move in self.moves())
        over = described["status"] in ("complete", "cancelled") or (
            described["status"] == "stalled" and not live
        )
        return over, (
            f"{self.node.name} drain {described['status']}: {drain.get('indices_left')} indices "
            f"left, moves {drain.get('moves_in_flight')} in flight, {drain.get('moves_done')} done"
        )

    def moves(self):
        from zoekt.models import Move

        return list(
            Move.objects.filter(trigger="drain", details__shutdown_id=self.record.pk)
            .select_related("source_node", "target_node")
            .order_by("id")
        )

    def summary(self) -> list[str]:
        described = self.describe()
        return [
            f"over: drain {described['status']}"
            + (f" ({described['status_reason']})" if described["status_reason"] else ""),
            *move_lines(self.moves()),
        ]

    def finish(self) -> list[str]:
        from zoekt import shutdowns
        from zoekt.audit import Actor

        lines = super().finish()
        if self.record is None:
            return lines
        status = self.describe()["status"]
        if status == "cancelled":
            return lines
        shutdowns.do_cancel_node_shutdown(
            self.node.pk,
            cancelled_by="zoekt_demo_incident",
            actor=Actor.command("zoekt_demo_incident"),
        )
        done = (
            "returned to service"
            if status == "complete"
            else "drain cancelled (what it moved stays moved; its moves in flight wound down)"
        )
        lines.append(f"{self.node.name}: {done} (zoekt_node cancel {self.node.name})")
        return lines


def make_incident(
    name: str, state_dir: Path, node_ref: str | None = None, namespace_id: int | None = None
) -> Incident:
    """The incident ``name`` on the node named, or on the node it picks."""
    if name == "hot":

        def hottest(node):
            rss, budget = node_rss(node)
            return (-(rss or 0) / (budget or 1), node.id)

        return Hot(pick_node(node_ref, hottest), state_dir, namespace_id)

    def fewest(node):  # the quickest to empty, among the nodes holding something
        count = index_count(node)
        return (count == 0, count, node.id)

    if name == "spike":
        return Spike(pick_node(node_ref, fewest), state_dir)
    if name == "overfill":  # the most to move: the node holding the most indices
        return Overfill(pick_node(node_ref, lambda node: (-index_count(node), node.id)), state_dir)
    if name == "drain":
        return Drain(pick_node(node_ref, fewest), state_dir)
    raise IncidentError(f"unknown incident {name!r}: one of {', '.join(INCIDENTS)}")
