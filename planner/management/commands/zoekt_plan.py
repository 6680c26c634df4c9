"""What the next rollout would do, and why; or run one now.

    manage.py zoekt_plan                          # per namespace and per node, with reasons
    manage.py zoekt_plan --dry-run                # the same: the preview is the default
    manage.py zoekt_plan --json                   # the plan (the contract's JSON)
    manage.py zoekt_plan --export-scenario f.json # the fleet as a scenario; then
    python -m planner plan --input f.json         #   replays to the same plan as --json
    manage.py zoekt_plan --apply                  # run one rollout batch now
    manage.py zoekt_plan --batch-size 500         # plan more (or fewer) namespaces

Without ``--apply`` (or with ``--dry-run``) nothing is written: the preview
runs the rollout's clean-up, selection, load and plan in a transaction that
is rolled back.
``--apply`` runs a real rollout batch under the rollout job's advisory lock
(and refuses while indexing is disabled or paused, or another rollout runs).
Progress of long loads goes to stderr (``-v 0`` silences it, ``-v 2`` shows
it at once and adds phase timings).

Every node id the report shows has the node's name next to it (``node 7
(zoekt-a)``) when the node has one; the namespaces selection skipped are
named with the reason (over GitLab's project limit, or waiting for project
statistics), and so are the nodes it left out (a node in its eviction
cooldown: until when, ``node_eviction_cooldown``).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from planner.core import plan as make_plan
from planner.explain import explain, render_text
from planner.loader import ScenarioLoader
from planner.plan import Plan, dumps
from planner.rollout import Outcome, RolloutResult, RolloutService
from planner.scenario import parse_scenario
from planner.selection import ResourcePool, SkippedNamespace
from zoekt import app_settings, clock, memory
from zoekt.locks import LockKey, try_advisory_lock
from zoekt.logging import get_logger
from zoekt.models import EnabledNamespace, Node
from zoekt.reasons import Reason
from zoekt.units import project_namespace_range

log = get_logger(__name__)

#: ``node 7`` or ``Node 7`` (a sentence's start); its name is added unless it follows already.
_NODE_ID = re.compile(r"\b([Nn]ode) (\d+)\b")


class Command(BaseCommand):
    help = (
        "Show what the next Zoekt rollout would do, per namespace and per node, with the reason "
        "each candidate node was taken or passed over; or run a rollout now (--apply)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--json", action="store_true", help="print the plan as JSON (the planner's contract)"
        )
        parser.add_argument(
            "--export-scenario",
            metavar="FILE",
            help="write the planner's input as a scenario file that `python -m planner plan` "
            "replays",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--dry-run",
            action="store_true",
            help="preview the next rollout and write nothing (the default)",
        )
        mode.add_argument(
            "--apply", action="store_true", help="run one rollout batch now and write its rows"
        )
        parser.add_argument(
            "--max-decisions",
            type=int,
            default=20,
            metavar="N",
            help="per namespace, show at most N placement decisions and N passed-over nodes "
            "each (default 20; 0 shows all)",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            help="namespaces per run (default: the rollout batch size setting)",
        )

    def handle(self, *args, **options):
        settings = app_settings.current()
        batch_size = options["batch_size"]
        if batch_size is None:
            batch_size = settings.rollout_batch_size
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        as_json = options["json"]
        progress = _Progress(self.stderr, options["verbosity"])
        service = RolloutService(
            record_decisions=not as_json,
            load_progress=progress.load,
            apply_progress=progress.apply,
        )
        if options["apply"]:
            result = self._apply(service, settings, batch_size)
        else:
            result = service.preview(batch_size, plan_anyway=True)
        progress.finish()

        plan = result.plan
        if plan is None:  # --apply that stopped before planning
            plan = make_plan(parse_scenario(self._scenario(result)), record_decisions=not as_json)
        if options["export_scenario"]:
            path = Path(options["export_scenario"])
            path.write_text(dumps(self._scenario(result)) + "\n", encoding="utf-8")
            self.stderr.write(f"scenario written to {path}")
        if options["verbosity"] >= 2:
            timings = ", ".join(f"{k} {v:.3f} s" for k, v in result.seconds.items())
            self.stderr.write(f"phases: {timings}")
        if as_json:
            names = _node_names(plan)
            for skipped in result.pool.skipped if result.pool is not None else ():
                self.stderr.write(f"skipped {_skipped_text(skipped)}")
            for node_id, until in result.pool.cooling_excluded if result.pool is not None else ():
                self.stderr.write(
                    f"not a candidate: {_node(node_id, names)}: {_cooldown_text(until)}"
                )
            self.stdout.write(plan.to_json())
            if result.outcome == Outcome.NO_ENABLED_NAMESPACES:
                self.stderr.write(_nothing_to_plan(result.pool)[0])
            elif result.outcome != Outcome.DRY_RUN:
                self.stderr.write(result.message)
            return
        self.stdout.write(
            self._report(
                result,
                plan,
                batch_size,
                applied=options["apply"],
                max_decisions=options["max_decisions"],
            )
        )

    # ------------------------------------------------------------------ #

    def _apply(
        self, service: RolloutService, settings: app_settings.ZoektSettings, batch_size: int
    ) -> RolloutResult:
        if not settings.indexing_enabled:
            raise CommandError(f"not applied: indexing is disabled ({Reason.INDEXING_DISABLED})")
        if settings.indexing_paused:
            raise CommandError(f"not applied: indexing is paused ({Reason.INDEXING_PAUSED})")
        with try_advisory_lock(LockKey.ROLLOUT) as acquired:
            if not acquired:
                log.info("rollout", trigger="zoekt_plan", skipped=Reason.LOCK_HELD)
                raise CommandError(f"not applied: another rollout is running ({Reason.LOCK_HELD})")
            result = service.execute(dry_run=False, batch_size=batch_size)
        log.info("rollout", trigger="zoekt_plan", **result.summary())
        return result

    @staticmethod
    def _scenario(result: RolloutResult) -> dict[str, Any]:
        if result.scenario is None:
            # The run stopped before loading (no namespaces or no nodes): the same pool, loaded.
            result.scenario = ScenarioLoader(result.pool).load()
        return result.scenario

    # ------------------------------------------------------------------ #
    # The human report

    def _report(
        self,
        result: RolloutResult,
        plan: Plan,
        batch_size: int,
        *,
        applied: bool,
        max_decisions: int,
    ) -> str:
        lines: list[str] = []
        scenario = self._scenario(result)
        self.names = _node_names(plan)
        factor = scenario["options"]["buffer_factor"]
        head = "Rollout run" if applied else "Next rollout (preview: nothing is written)"
        strategy = scenario["options"].get("strategy", "first_fit")
        lines.append(
            f"{head}: batch size {batch_size}, buffer factor {_factor(factor)}, "
            f"placement {strategy}"
        )
        lines.append(_memory_line(scenario))
        deleted = result.replicas_without_indices_deleted
        verb = "removed" if applied else "to remove"
        lines.append(f"Replicas without indices {verb} first: {deleted}")
        pool = result.pool
        if result.outcome == Outcome.NO_ENABLED_NAMESPACES:
            headline, *why = _nothing_to_plan(pool)
            lines.append(f"{headline}: the rollout stops here.")
            lines.extend(why)
            lines.extend(_skipped_section(pool.skipped))
            lines.extend(["", *self._node_section(pool, plan, [])])
            return "\n".join(lines)
        if result.outcome == Outcome.NO_AVAILABLE_NODES:
            lines.append(f"{result.message}: the rollout stops here.")
        lines.append(
            f"Namespaces: {len(pool.namespaces)} selected; create {len(plan.create)}, "
            f"destroy {len(plan.destroy)}, unchanged {len(plan.unchanged)}, "
            f"failures {len(plan.failures)}; required {_bytes(plan.total_required_storage_bytes)}"
        )
        lines.extend(_skipped_section(pool.skipped))
        if plan.bounds:
            lines.append(
                "Balance (max node utilisation vs the best achievable lower bound): "
                + "; ".join(
                    f"{dim} {_fraction(values.get('max_utilization'))} vs "
                    f"{_fraction(values.get('lower_bound'))}"
                    for dim, values in sorted(plan.bounds.items())
                )
            )
        explanations = explain(plan) if plan.log is not None else []
        lines.extend(["", "Per namespace:"])
        by_namespace = {ns.namespace_id: ns for ns in plan.namespaces_in_order}
        if not explanations:
            lines.append("  (no decision records)")
        for explanation in explanations:
            lines.extend(
                self._namespace_lines(explanation, by_namespace, max_decisions, self.names)
            )
        lines.extend(["", *self._node_section(pool, plan, explanations)])
        if result.changes is not None:
            lines.extend(["", *self._changes_section(result)])
        return "\n".join(lines)

    @staticmethod
    def _namespace_lines(
        explanation: dict[str, Any],
        by_namespace: dict[int, Any],
        max_decisions: int,
        names: dict[int, str],
    ) -> list[str]:
        """One namespace: planner.explain's text (capped), then the indices planned."""
        decisions = explanation["decisions"]
        shown = dict(explanation)
        hidden_nodes = 0
        if max_decisions and len(decisions) > max_decisions:
            shown["decisions"] = decisions[:max_decisions]
        if max_decisions:
            capped = []
            for decision in shown["decisions"]:
                if len(decision["passed_over"]) > max_decisions:
                    hidden_nodes += len(decision["passed_over"]) - max_decisions
                    decision = {**decision, "passed_over": decision["passed_over"][:max_decisions]}
                capped.append(decision)
            shown["decisions"] = capped
        lines = _with_names(render_text([shown]).rstrip("\n"), names).splitlines()
        if len(shown["decisions"]) < len(decisions) or hidden_nodes:
            lines.append(
                f"  (showing {len(shown['decisions'])} of {len(decisions)} decisions and at most "
                f"{max_decisions} passed-over nodes each; --max-decisions 0 shows all)"
            )
        ns_plan = by_namespace[explanation["namespace_id"]]
        verb = "simulated (not provisioned)" if ns_plan.errors else "planned"
        for replica_idx, replica in enumerate(ns_plan.replicas):
            for index_idx, index in enumerate(replica.indices):
                covers = project_namespace_range(
                    index.project_namespace_id_from, index.project_namespace_id_to
                )
                text = (
                    f"  {verb} replica {replica_idx} index {index_idx}: "
                    f"{_node(index.node_id, names)}, {covers}, "
                    f"reserves {_bytes(index.required_storage_bytes)}"
                )
                if index.estimated_memory_bytes is not None:
                    ceiling = index.max_memory_bytes
                    text += f", estimated memory {_bytes(index.estimated_memory_bytes)} (max " + (
                        "none: no budget)" if ceiling is None else f"{_bytes(ceiling)})"
                    )
                lines.append(text)
        return lines

    def _node_section(self, pool: ResourcePool, plan: Plan, explanations: list[dict]) -> list[str]:
        candidates = pool.nodes
        lines = ["Per node (candidates in candidate order):"]
        changes = {node.id: node for node in plan.nodes}
        taken: Counter[int] = Counter()
        passed: dict[int, Counter[str]] = {}
        for ns in explanations:
            for node in ns["nodes"]:
                taken[node["node_id"]] += len(node["taken"])
                passed.setdefault(node["node_id"], Counter()).update(node["passed_over"])
        names = {}
        for position, node in enumerate(candidates):
            name = str(node.metadata.get("name") or f"node-{node.id}")
            names[node.id] = name
            change = changes.get(node.id)
            if change is None:
                text = f"unclaimed {_bytes(node.unclaimed_storage_bytes)}, no new indices"
            else:
                text = (
                    f"unclaimed {_bytes(change.unclaimed_storage_bytes_before)} → "
                    f"{_bytes(change.unclaimed_storage_bytes_after)}, claims "
                    f"{_bytes(change.claimed_storage_bytes)} for {len(change.indices)} "
                    f"new index(es) of namespaces {_ids(change.namespace_ids)}"
                )
            if change is not None and change.memory is not None:
                mem = change.memory
                if mem.memory_budget_bytes is None:
                    text += "; memory: no budget"
                else:
                    text += (
                        f"; memory budget {_bytes(mem.memory_budget_bytes)}, unclaimed "
                        f"{_bytes(mem.unclaimed_memory_bytes_before)} → "
                        f"{_bytes(mem.unclaimed_memory_bytes_after)}"
                    )
            lines.append(f"  #{position + 1} node {node.id} ({name}): {text}")
            reasons = passed.get(node.id)
            if taken[node.id] or reasons:
                parts = [f"taken for {taken[node.id]} index(es)"] if taken[node.id] else []
                if reasons:
                    parts.append(
                        "passed over "
                        + ", ".join(
                            f"{count}× {reason.replace('_', ' ')}"
                            for reason, count in sorted(reasons.items())
                        )
                    )
                lines.append(f"      {'; '.join(parts)}")
        excluded = _excluded_nodes({node.id for node in candidates}, dict(pool.cooling_excluded))
        if excluded:
            lines.append("Not candidates:")
            for node_id, name, why in excluded:
                lines.append(f"  node {node_id} ({name}): {why}")
        return lines

    def _changes_section(self, result: RolloutResult) -> list[str]:
        changes = result.changes
        lines = [f"Result: {result.message}"]
        for success in changes.successes:
            if "replica_id" in success:
                lines.append(
                    f"  namespace {success['namespace_id']}: "
                    f"replica {success['replica_id']} created"
                )
            else:
                lines.append(
                    f"  namespace {success['namespace_id']}: "
                    f"{success['replicas_destroyed']} replica(s) destroyed"
                )
        for error in changes.errors:
            where = f"  namespace {error['failed_namespace_id']}"
            if error.get("replica_idx") is not None:
                where += f" replica {error['replica_idx']}"
            if error["node_id"] is not None:
                names = dict(self.names)
                if error.get("node_name"):
                    names[error["node_id"]] = error["node_name"]
                where += f" on {_node(error['node_id'], names)}"
            lines.append(f"{where}: {error['type']}: {error['message']}")
        if changes.failed_namespace_ids:
            ids = ", ".join(map(str, changes.failed_namespace_ids))
            lines.append(f"  marked rollout-failed: {ids}")
        if result.re_enqueue:
            lines.append(
                "More namespaces need work and nodes have room: run again for the next batch."
            )
        return lines


def _excluded_nodes(
    candidate_ids: set[int], cooling: dict[int, datetime]
) -> list[tuple[int, str, str]]:
    """Every other node, with why the selection left it out.

    ``cooling``: the nodes selection left out for their eviction cooldown,
    with its end (``ResourcePool.cooling_excluded``).
    """
    now = clock.now()
    configured = app_settings.current().node_memory_budget_bytes
    online = set(Node.objects.online(now).values_list("id", flat=True))
    restarting = set(Node.objects.in_restart(now).values_list("id", flat=True))
    draining = set(Node.objects.in_shutdown(now).values_list("id", flat=True)) - restarting
    out = []
    rows = (
        Node.objects.exclude(id__in=candidate_ids)
        .with_unclaimed_storage_bytes()
        .order_by("id")
        .values_list(
            "id",
            "metadata",
            "services",
            "annotated_unclaimed_storage_bytes",
            "eviction_cooldown_until",
        )
    )
    for node_id, metadata, services, unclaimed, cooldown_until in rows:
        reasons = []
        if node_id in cooling:
            reasons.append(_cooldown_text(cooling[node_id]))
        elif cooldown_until is not None and cooldown_until > now:
            reasons.append(_cooldown_text(cooldown_until))
        if Node.Service.ZOEKT not in services:
            reasons.append("not a search node")
        if node_id not in online:
            reasons.append("offline")
        if node_id in restarting:
            reasons.append(f"being restarted (docs/operations.md; {Reason.NODE_IN_RESTART})")
        if node_id in draining:
            reasons.append(f"drained or being drained (docs/operations.md; {Reason.NODE_IN_DRAIN})")
        if unclaimed <= 0:
            reasons.append(f"no unclaimed storage ({_bytes(unclaimed)})")
        if memory.excluded_from_placement(metadata, configured):
            budget, source = memory.memory_budget(metadata, configured)
            rss = memory.webserver_counter(metadata, "rss_bytes")
            reasons.append(
                f"over the high memory watermark: webserver RSS {_bytes(rss)} is "
                f"{_fraction(memory.memory_percent_used(rss, budget))} of its {source} memory "
                f"budget {_bytes(budget)} (≥ {_fraction(memory.MEMORY_WATERMARK_LIMIT_HIGH)}; "
                f"{Reason.MEMORY_HIGH_WATERMARK})"
            )
        name = str((metadata or {}).get("name") or f"node-{node_id}")
        out.append((node_id, name, ", ".join(reasons) or "not selected"))
    return out


def _node_names(plan: Plan) -> dict[int, str]:
    """Every node's name: the Node rows' metadata ``name``, else the plan's."""
    names: dict[int, str] = {node.id: str(node.name) for node in plan.nodes if node.name}
    for node_id, name in Node.objects.filter(metadata__has_key="name").values_list(
        "id", "metadata__name"
    ):
        if name:
            names[node_id] = str(name)
    return names


def _node(node_id: int, names: dict[int, str]) -> str:
    """``node 7 (zoekt-a)``; ``node 7`` for a node without a name."""
    name = names.get(node_id)
    return f"node {node_id}" if name is None else f"node {node_id} ({name})"


def _with_names(text: str, names: dict[int, str]) -> str:
    """``node 7`` becomes ``node 7 (zoekt-a)`` wherever a named node's id is not followed by
    its name already (``Node 7 has …`` too, and ``node 7 (1500 bytes …)``)."""

    def named(match: re.Match[str]) -> str:
        word, node_id = match.group(1), int(match.group(2))
        name = names.get(node_id)
        if name is None or text.startswith(f" ({name})", match.end()):
            return match.group(0)
        return f"{word} {node_id} ({name})"

    return _NODE_ID.sub(named, text)


def _cooldown_text(until: datetime) -> str:
    """Why a cooling node takes no new index: until when, and the reason code."""
    left = max(int((until - clock.now()).total_seconds()), 0)
    return (
        f"in its eviction cooldown until {until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC "
        f"({left // 3600}:{left % 3600 // 60:02d} h left; {Reason.NODE_EVICTION_COOLDOWN})"
    )


def _nothing_to_plan(pool: ResourcePool) -> list[str]:
    """Why a run selected no namespace: the headline, then what the enabled namespaces are at.

    GitLab's "No enabled namespaces found" is said only when none is enabled.
    """
    enabled = EnabledNamespace.objects.count()
    if not enabled:
        return ["No enabled namespaces found"]
    settings = app_settings.current()
    waiting = (
        EnabledNamespace.objects.with_rollout_blocked(settings.rollout_retry_interval_seconds)
        .with_mismatched_replicas(settings.default_number_of_replicas)
        .count()
    )
    if not waiting and not pool.skipped:
        return [
            f"No enabled namespace needs work ({enabled:,} enabled)",
            "Each has as many replicas as it should: none to create or remove.",
        ]
    lines = [f"No enabled namespace can be planned now ({enabled:,} enabled)"]
    if waiting:
        lines.append(
            f"{waiting:,} namespace(s) that need replicas created or removed wait to be retried "
            "after a failed rollout (zoekt_rollout_retry_interval)."
        )
    return lines


def _skipped_text(skipped: SkippedNamespace) -> str:
    head = f"namespace {skipped.namespace_id} (enabled namespace {skipped.enabled_namespace_id})"
    if skipped.reason == Reason.WAITING_FOR_PROJECT_STATISTICS:
        return (
            f"{head}: none of its projects has statistics yet "
            f"({skipped.project_namespaces:,} project namespaces); it waits for them and takes "
            f"no place in the batch ({skipped.reason})"
        )
    return (
        f"{head}: more than {skipped.limit:,} project namespaces, GitLab's limit for a rollout "
        f"({skipped.reason})"
    )


def _skipped_section(skipped: tuple[SkippedNamespace, ...]) -> list[str]:
    """The namespaces selection left out of the batch, each with its reason."""
    if not skipped:
        return []
    lines = [f"Skipped (not planned): {len(skipped)} namespace(s) that need work"]
    lines.extend(f"  {_skipped_text(entry)}" for entry in skipped)
    return lines


def _memory_line(scenario: dict[str, Any]) -> str:
    options = scenario["options"].get("memory") or {}
    budget = options.get("node_memory_budget_bytes")
    if budget is None:
        return (
            "Memory planning: off (zoekt_node_memory_budget_bytes is not set; "
            "the plan is the disk-only plan)"
        )
    own = sum(1 for node in scenario["nodes"] if node.get("memory_budget_bytes") is not None)
    return (
        f"Memory planning: on, budget {_bytes(budget)} per node ({own} node(s) use the limit "
        f"they report), memory ratio {options.get('memory_ratio')}, concurrency factor "
        f"{options.get('concurrency_factor')}"
    )


def _factor(value: float) -> str:
    """The buffer factor to two decimals: ``3``, ``2.5``, ``2.72``."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _bytes(value: int) -> str:
    """Exact bytes, with a binary unit beside them from 1 KiB on."""
    text = f"{value:,} bytes"
    size = abs(value)
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor:
            return f"{text} ({value / factor:.1f} {unit})"
    return text


def _ids(values: list[int], limit: int = 20) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown if len(values) <= limit else f"{shown} … (+{len(values) - limit})"


class _Progress:
    """Progress lines on stderr for long runs: after a second (at once with -v 2), once a second."""

    def __init__(self, stream: OutputWrapper, verbosity: int, *, delay: float = 1.0) -> None:
        self.stream = stream
        self.verbosity = verbosity
        self.delay = 0.0 if verbosity >= 2 else delay
        self.started = time.monotonic()
        self.last = float("-inf")
        self.pending: str | None = None
        self.shown = False
        self.tty = bool(getattr(stream, "isatty", lambda: False)())

    def load(self, done: int, total: int, projects: int) -> None:
        self._emit(f"loaded {done:,}/{total:,} namespaces ({projects:,} projects)", done == total)

    def apply(self, done: int, total: int) -> None:
        self._emit(f"applied {done:,}/{total:,} namespaces", done == total)

    def _emit(self, text: str, final: bool) -> None:
        if self.verbosity <= 0:
            return
        now = time.monotonic()
        self.pending = text
        if now - self.started < self.delay:
            return
        if not final and now - self.last < 1.0:
            return
        self.last = now
        self._write(text)

    def _write(self, text: str) -> None:
        self.pending = None
        self.shown = True
        if self.tty:
            self.stream.write(f"\r{text}\x1b[K", ending="")
        else:
            self.stream.write(text)
        self.stream.flush()

    def finish(self) -> None:
        if self.shown and self.pending is not None:
            self._write(self.pending)
        if self.shown and self.tty:
            self.stream.write("")
