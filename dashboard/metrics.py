"""Prometheus ``/metrics``: the fleet read from the database at scrape time.

A custom collector (``FleetCollector``) reads ``dashboard.readmodels.fleet.fleet_overview``,
``eviction.queries.eviction_overview`` and four grouped counts on every
scrape and yields gauges and counters; nothing is kept in the process, so
every web replica answers the same and no background job is needed. The
cost is a fixed number of queries whatever the size of the fleet or the
number of decisions (the dashboard's tests count them).

Names: GitLab's own where GitLab has the metric (its ``gitlab-exporter``
emits them under ``search_zoekt_*`` with these labels), and
``zoekt_control_*`` for ours. ``docs/dashboard.md`` lists them all.

Access: closed in production (``DJANGO_DEBUG`` off). A scrape is answered when
it sends ``Authorization: Bearer <ZOEKT_METRICS_TOKEN>`` (compared in constant
time), when the address it connects from (``REMOTE_ADDR``, never a forwarded
header a client can write) is in ``ZOEKT_METRICS_ALLOWED_NETWORKS``, or when it
comes with a staff session (the dashboard links here). Otherwise it gets 401
when a token would let it in, 403 when nothing it could send would, with the
API's JSON error shape. In development it is open unless a token is set.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from api.errors import error_body
from dashboard.readmodels.fleet import FleetOverview, fleet_overview
from eviction.models import EvictionDecision
from eviction.queries import eviction_overview
from eviction.rebalance import balance_report
from gitlab_sync.status import status as gitlab_status
from planner.models import RolloutPlan
from zoekt import admission, clock, jobmetrics, nodeapimetrics
from zoekt.logging import get_logger
from zoekt.models import Index, Move, NodeShutdown, Repository

log = get_logger(__name__)

GITLAB_NODE_LABELS = ("zoekt_node_id", "zoekt_node_name")
#: Upper bounds (seconds) of the move-duration histogram: 10 min to a day.
MOVE_DURATION_BUCKETS = (600, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 24 * 3600)
GITLAB_NODE_LABELS_SHORT = ("node_id", "node_name")


def _gauge(name: str, documentation: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=list(labels))


class FleetCollector:
    """Yields every fleet gauge from one consistent read of the database."""

    def collect(self) -> Iterator[Metric]:
        now = clock.now()
        overview = fleet_overview(now=now)
        yield from self._gitlab_node_metrics(overview)
        yield from self._gitlab_counts(overview, now)
        yield from self._node_metrics(overview)
        yield from self._fleet_counts(overview)
        yield from self._maintenance(overview)
        yield from self._rollout_plan()
        yield from self._eviction(now)
        yield from self._balance(now)
        yield from self._jobs()
        yield from self._node_api()
        yield from self._gitlab_sync(now)

    # --- GitLab's names -------------------------------------------------------------
    def _gitlab_node_metrics(self, overview: FleetOverview) -> Iterator[Metric]:
        status = _gauge(
            "search_zoekt_nodes_status",
            "Status of each Zoekt node: 1 online (seen within the online threshold), 0 offline.",
            GITLAB_NODE_LABELS,
        )
        unclaimed = _gauge(
            "search_zoekt_node_unclaimed_storage_bytes",
            "Unclaimed storage bytes of each Zoekt node (usable minus reserved; may be negative).",
            GITLAB_NODE_LABELS,
        )
        percent = _gauge(
            "search_zoekt_node_storage_percent_used",
            "Share of storage used on each Zoekt node (0 to 1).",
            GITLAB_NODE_LABELS,
        )
        queue = _gauge(
            "search_zoekt_task_processing_queue_size",
            "Tasks waiting to be processed by each Zoekt node (pending or processing, due now).",
            ("node_name", "node_id"),
        )
        tasks = _gauge(
            "search_zoekt_node_tasks",
            "Zoekt tasks of each node by state.",
            (*GITLAB_NODE_LABELS_SHORT, "state"),
        )
        for node in overview.nodes:
            labels = [str(node.id), node.name]
            status.add_metric(labels, 1 if node.online else 0)
            unclaimed.add_metric(labels, node.unclaimed_storage_bytes)
            percent.add_metric(labels, node.storage_percent_used)
            queue.add_metric([node.name, str(node.id)], node.tasks_due)
            for state, count in node.tasks.items():
                tasks.add_metric([str(node.id), node.name, state], count)
        yield from (status, unclaimed, percent, queue, tasks)

    def _gitlab_counts(self, overview: FleetOverview, now) -> Iterator[Metric]:
        repositories = _gauge(
            "search_zoekt_repositories_states_total",
            "Zoekt repositories in each state.",
            ("state",),
        )
        for state, count in overview.repositories.items():
            repositories.add_metric([state], count)
        indices = _gauge("search_zoekt_indices_states", "Zoekt indices in each state.", ("state",))
        for state, count in overview.indices.items():
            indices.add_metric([state], count)
        levels = _gauge(
            "search_zoekt_indices_watermark_levels",
            "Zoekt indices at each watermark level.",
            ("watermark_level",),
        )
        for level, count in overview.index_watermark_levels.items():
            levels.add_metric([level], count)
        stale = _gauge(
            "search_zoekt_indices_with_stale_used_storage_bytes",
            "Zoekt indices whose used_storage_bytes was not refreshed since their last indexing.",
        )
        stale.add_metric([], Index.objects.with_stale_used_storage_bytes_updated_at().count())
        names = {node.id: node.name for node in overview.nodes}
        namespaces = _gauge(
            "search_zoekt_node_enabled_namespaces",
            "Enabled namespaces with an index on each Zoekt node.",
            GITLAB_NODE_LABELS_SHORT,
        )
        per_node = dict(
            Index.objects.filter(zoekt_enabled_namespace__isnull=False)
            .order_by()
            .values_list("zoekt_node_id")
            .annotate(count=Count("zoekt_enabled_namespace_id", distinct=True))
            .values_list("zoekt_node_id", "count")
        )
        for node_id, name in names.items():
            namespaces.add_metric([str(node_id), name], per_node.get(node_id, 0))
        schema = _gauge(
            "search_zoekt_repositories_schema_version_count",
            "Zoekt repositories whose schema_version is below their node's.",
            ("target_schema_version", *GITLAB_NODE_LABELS),
        )
        for node_id, target, count in (
            Repository.objects.filter(
                schema_version__lt=F("zoekt_index__zoekt_node__schema_version")
            )
            .order_by()
            .values_list("zoekt_index__zoekt_node_id", "zoekt_index__zoekt_node__schema_version")
            .annotate(count=Count("id"))
            .values_list(
                "zoekt_index__zoekt_node_id", "zoekt_index__zoekt_node__schema_version", "count"
            )
        ):
            schema.add_metric([str(target), str(node_id), names.get(node_id, "")], count)
        yield from (repositories, indices, levels, stale, namespaces, schema)

    # --- ours -----------------------------------------------------------------------
    def _node_metrics(self, overview: FleetOverview) -> Iterator[Metric]:
        gauges = {
            "searchable": _gauge(
                "zoekt_control_node_searchable",
                "1 when searches may go to the node (online, search service, healthy processes).",
                GITLAB_NODE_LABELS,
            ),
            "total": _gauge(
                "zoekt_control_node_total_bytes",
                "Disk size reported by the node.",
                GITLAB_NODE_LABELS,
            ),
            "used": _gauge(
                "zoekt_control_node_used_bytes", "Disk used on the node.", GITLAB_NODE_LABELS
            ),
            "reserved": _gauge(
                "zoekt_control_node_reserved_storage_bytes",
                "Sum of the reservations of the node's indices (every state).",
                GITLAB_NODE_LABELS,
            ),
            "estimated": _gauge(
                "zoekt_control_node_estimated_memory_bytes",
                "Estimated webserver memory of the node's ready and pre-ready indices "
                "(repository size x memory ratio).",
                GITLAB_NODE_LABELS,
            ),
            "rss": _gauge(
                "zoekt_control_node_observed_memory_bytes",
                "Webserver resident memory (RSS) the node last reported.",
                GITLAB_NODE_LABELS,
            ),
            "budget": _gauge(
                "zoekt_control_node_memory_budget_bytes",
                "The node's memory budget (its reported limit, else the configured budget).",
                GITLAB_NODE_LABELS,
            ),
            "shards": _gauge(
                "zoekt_control_node_shards_loaded",
                "Index shards the node's webserver reports loaded.",
                GITLAB_NODE_LABELS,
            ),
        }
        gauges.update(
            slots=_gauge(
                "zoekt_control_node_indexing_slots",
                "Task slots of the node (its concurrency limit).",
                GITLAB_NODE_LABELS,
            ),
            in_flight=_gauge(
                "zoekt_control_node_indexing_in_flight",
                "Tasks handed to the node and not yet called back (the slots in use).",
                GITLAB_NODE_LABELS,
            ),
            temporary=_gauge(
                "zoekt_control_node_indexing_temporary_bytes",
                "Temporary bytes of the node's builds in flight (index bytes x the "
                "temporary space factor).",
                GITLAB_NODE_LABELS,
            ),
            headroom=_gauge(
                "zoekt_control_node_indexing_headroom_bytes",
                "Disk left for builds below the build ceiling (the high watermark less the "
                "hysteresis band) after the builds in flight (negative: past it, one build "
                "at a time).",
                GITLAB_NODE_LABELS,
            ),
        )
        backlog = _gauge(
            "zoekt_control_node_indexing_backlog",
            "Pending tasks of the node by admission priority.",
            (*GITLAB_NODE_LABELS, "priority"),
        )
        for node in overview.nodes:
            labels = [str(node.id), node.name]
            gauges["searchable"].add_metric(labels, 1 if node.searchable else 0)
            gauges["total"].add_metric(labels, node.total_bytes)
            gauges["used"].add_metric(labels, node.used_bytes)
            gauges["reserved"].add_metric(labels, node.reserved_storage_bytes)
            gauges["slots"].add_metric(labels, node.slots)
            gauges["in_flight"].add_metric(labels, node.indexing.in_flight)
            gauges["temporary"].add_metric(labels, node.indexing.temporary_bytes)
            gauges["headroom"].add_metric(labels, node.build_headroom_bytes)
            for priority in admission.Priority:
                name = priority.name.lower()
                backlog.add_metric([*labels, name], node.indexing.backlog.get(name, 0))
            m = node.memory
            if m is None:
                continue
            gauges["estimated"].add_metric(labels, m.estimated_memory_bytes)
            if m.rss_bytes is not None:
                gauges["rss"].add_metric(labels, m.rss_bytes)
            if m.memory_budget_bytes is not None:
                gauges["budget"].add_metric(labels, m.memory_budget_bytes)
            if m.shards_loaded is not None:
                gauges["shards"].add_metric(labels, m.shards_loaded)
        yield from gauges.values()
        yield backlog

    def _fleet_counts(self, overview: FleetOverview) -> Iterator[Metric]:
        replicas = _gauge(
            "zoekt_control_replicas_states", "Zoekt replicas in each state.", ("state",)
        )
        for state, count in overview.replicas.items():
            replicas.add_metric([state], count)
        tasks = _gauge("zoekt_control_tasks_states", "Zoekt tasks in each state.", ("state",))
        for state, count in overview.tasks.items():
            tasks.add_metric([state], count)
        namespaces = _gauge(
            "zoekt_control_enabled_namespaces",
            "Enabled namespaces, by whether search is on.",
            ("search",),
        )
        namespaces.add_metric(["true"], overview.search_enabled_namespaces)
        namespaces.add_metric(
            ["false"], overview.enabled_namespaces - overview.search_enabled_namespaces
        )
        nodes = _gauge(
            "zoekt_control_nodes", "Zoekt nodes, online and searchable counts.", ("status",)
        )
        nodes.add_metric(["all"], len(overview.nodes))
        nodes.add_metric(["online"], overview.online)
        nodes.add_metric(["searchable"], overview.searchable)
        ratio = _gauge(
            "zoekt_control_memory_ratio",
            "The memory ratio setting: estimated memory per repository byte.",
        )
        ratio.add_metric([], overview.memory_ratio)
        dark = _gauge(
            "zoekt_control_namespaces_dark",
            "Enabled namespaces with search on whose ready indices on searchable nodes do not "
            "cover every project (a search finds no target), by reason.",
            ("reason",),
        )
        for reason, count in overview.dark_namespaces.items():
            dark.add_metric([reason], count)
        yield from (replicas, tasks, namespaces, nodes, ratio, dark)

    def _maintenance(self, overview: FleetOverview) -> Iterator[Metric]:
        """Nodes with a live shutdown record, and what each drain has left (no query of
        its own: the overview read the live records)."""
        shutdowns = _gauge(
            "zoekt_control_nodes_in_shutdown",
            "Nodes with a live shutdown record (docs/operations.md), by type and status.",
            ("type", "status"),
        )
        counts = Counter(
            (node.shutdown.type, node.shutdown.status)
            for node in overview.nodes
            if node.shutdown is not None
        )
        for type_ in NodeShutdown.Type:
            for status in NodeShutdown.LIVE:
                shutdowns.add_metric([type_.value, status.value], counts[(type_, status)])
        left = {
            "bytes": _gauge(
                "zoekt_control_node_drain_bytes_left",
                "Bytes of index still on a draining node (remove or replace).",
                GITLAB_NODE_LABELS,
            ),
            "indices": _gauge(
                "zoekt_control_node_drain_indices_left",
                "Indices still on a draining node (remove or replace).",
                GITLAB_NODE_LABELS,
            ),
            "moves": _gauge(
                "zoekt_control_node_drain_moves_in_flight",
                "Live moves off a draining node.",
                GITLAB_NODE_LABELS,
            ),
        }
        for node in overview.nodes:
            drain = node.shutdown.left if node.shutdown is not None else None
            if drain is None:
                continue
            labels = [str(node.id), node.name]
            left["bytes"].add_metric(labels, drain.bytes)
            left["indices"].add_metric(labels, drain.indices)
            left["moves"].add_metric(labels, drain.moves_in_flight)
        yield shutdowns
        yield from left.values()

    def _rollout_plan(self) -> Iterator[Metric]:
        """The last rollout's phases and bounds, from its kept plan (one query)."""
        row = RolloutPlan.objects.filter(dry_run=False).only("created_at", "summary").first()
        if row is None:
            return
        summary = row.summary or {}
        at = _gauge(
            "zoekt_control_rollout_plan_timestamp_seconds",
            "When the last rollout plan was made (Unix time).",
        )
        at.add_metric([], row.created_at.timestamp())
        phases = _gauge(
            "zoekt_control_rollout_plan_phase_seconds",
            "Seconds the last rollout spent in each phase (select, load, plan, ...).",
            ("phase",),
        )
        for phase, seconds in sorted((summary.get("seconds") or {}).items()):
            phases.add_metric([phase], seconds)
        bound = _gauge(
            "zoekt_control_rollout_plan_utilization_over_bound",
            "The last plan's busiest node over the lower bound of any placement, per dimension.",
            ("dimension",),
        )
        for dimension, figures in sorted((summary.get("bounds") or {}).items()):
            if isinstance(figures, dict) and figures.get("ratio") is not None:
                bound.add_metric([dimension], figures["ratio"])
        yield from (at, phases, bound)

    def _balance(self, now) -> Iterator[Metric]:
        """The desired balance and the rebalance reconciler (``eviction.rebalance``'s
        report, the API's: a fixed number of queries, and the desired balance computed in
        memory)."""
        _fleet, balance, report = balance_report(now=now)
        figures = {
            "zoekt_control_balance_converged": (
                "1 when the fleet is at its desired balance (no move needed), else 0.",
                int(balance.converged),
            ),
            "zoekt_control_balance_indices_misplaced": (
                "Indices not where the desired balance has them.",
                len(balance.misplaced),
            ),
            "zoekt_control_balance_bytes_to_move": (
                "Bytes the desired balance's moves would carry.",
                balance.bytes_to_move,
            ),
        }
        ratio = _gauge(
            "zoekt_control_balance_busiest_over_lower_bound",
            "The busiest node's dominant share over the fleet's lower bound (1.0 is the best "
            "any layout does), now and when converged.",
            ("when",),
        )
        bounds = balance.over_lower_bound()
        for when, key in (("now", "now"), ("converged", "desired")):
            if bounds[key]["ratio"] is not None:
                ratio.add_metric([when], bounds[key]["ratio"])
        yield ratio
        reconciler, window = report["reconciler"], report["last_24_hours"]
        figures |= {
            "zoekt_control_rebalance_enabled": (
                "1 while the rebalance reconciler is on (zoekt_rebalance_enabled).",
                int(reconciler["enabled"]),
            ),
            "zoekt_control_rebalance_moves_in_flight": (
                "Rebalance moves planned or building.",
                reconciler["moves_in_flight"],
            ),
            "zoekt_control_rebalance_moves_last_24h": (
                "Rebalance moves planned, started or done in the last 24 hours.",
                window["moves"],
            ),
            "zoekt_control_rebalance_redundant_moves_last_24h": (
                "Rebalance moves in the last 24 hours of an index a rebalance move of the "
                "window had moved already (the target is 0).",
                window["redundant_moves"],
            ),
        }
        for name, (documentation, value) in figures.items():
            gauge = _gauge(name, documentation)
            gauge.add_metric([], value)
            yield gauge
        aside = _gauge(
            "zoekt_control_rebalance_standing_aside",
            "1 while the rebalance reconciler stands aside, with the reason (indexing off, a "
            "high watermark, a shutdown, eviction or a drain moving).",
            ("reason",),
        )
        if reconciler["standing_aside"]:
            aside.add_metric([reconciler["standing_aside_reason"]], 1)
        yield aside

    def _eviction(self, now) -> Iterator[Metric]:
        """Eviction decisions by trigger and mode, cooldowns and sustain clocks (3 queries)."""
        overview = eviction_overview(recent=0, now=now)
        applied = CounterMetricFamily(
            "zoekt_control_evictions",
            "Eviction decisions applied, by trigger and mode.",
            labels=["trigger", "mode"],
        )
        namespaces = CounterMetricFamily(
            "zoekt_control_eviction_namespaces_affected",
            "Root namespaces affected by applied eviction decisions, by trigger and mode.",
            labels=["trigger", "mode"],
        )
        # Every trigger and mode, zeros included, so a rate starts at the first eviction.
        for trigger in EvictionDecision.Trigger.values:
            for mode in EvictionDecision.Mode.values:
                applied.add_metric([trigger, mode], overview.applied.get((trigger, mode), 0))
                namespaces.add_metric(
                    [trigger, mode], overview.namespaces_affected.get((trigger, mode), 0)
                )
        skipped = CounterMetricFamily(
            "zoekt_control_eviction_decisions_skipped",
            "Eviction runs that decided not to evict from a node, by trigger and reason "
            "(each repeat of a folded decision counted).",
            labels=["trigger", "reason"],
        )
        for (trigger, reason), count in sorted(overview.skipped.items()):
            skipped.add_metric([trigger, reason], count)
        cooling = _gauge(
            "zoekt_control_nodes_in_eviction_cooldown",
            "Nodes in their eviction cooldown: no eviction from them, no placement on them.",
        )
        cooling.add_metric([], len(overview.cooling))
        over_high = _gauge(
            "zoekt_control_node_over_high_watermark_seconds",
            "Seconds since the node's disk reached the high watermark (its sustain clock, "
            "kept through the hysteresis band); only nodes with a running clock.",
            GITLAB_NODE_LABELS,
        )
        for node in overview.over_high:
            over_high.add_metric([str(node.node_id), node.node_name], node.over_high_seconds)
        yield from (applied, namespaces, skipped, cooling, over_high)
        yield from self._moves()

    def _moves(self) -> Iterator[Metric]:
        """Moves by state and reason, and the bytes moving (one grouped query).

        A move with no reason (most states) has no ``reason`` label rather than an empty
        one, so the family's samples carry ``state`` alone or ``state`` and ``reason``."""
        by_state = Metric(
            "zoekt_control_moves",
            "Moves kept, by state, and by reason where the move has one (in flight: planned, "
            "building, ready_to_swap, swapping; fallbacks and parked moves carry their reason).",
            "gauge",
        )
        moving = _gauge(
            "zoekt_control_moving_bytes", "Used bytes of the indices being moved off their node."
        )
        rows = (
            Move.objects.order_by()
            .values_list("state", "reason")
            .annotate(n=Count("id"), size=Sum("bytes"))
            .values_list("state", "reason", "n", "size")
        )
        seen = set()
        in_flight = 0
        for state, reason, count, size in rows:
            labels = {"state": state, "reason": reason} if reason else {"state": state}
            by_state.add_sample("zoekt_control_moves", labels, count)
            seen.add(state)
            if state in Move.LIVE:
                in_flight += size or 0
        for state in Move.State.values:
            if state not in seen:
                by_state.add_sample("zoekt_control_moves", {"state": state}, 0)
        moving.add_metric([], in_flight)
        yield from (by_state, moving, self._move_durations())

    def _move_durations(self) -> Metric:
        """Planned-to-done seconds of the finished moves, by trigger (one grouped query)."""
        took = ExpressionWrapper(F("done_at") - F("created_at"), output_field=DurationField())
        counts = {
            f"le_{bound}": Count("id", filter=Q(took__lte=timedelta(seconds=bound)))
            for bound in MOVE_DURATION_BUCKETS
        }
        rows = (
            Move.objects.filter(state=Move.State.DONE, done_at__isnull=False)
            .annotate(took=took)
            .order_by()
            .values("trigger")
            .annotate(total=Count("id"), seconds=Sum("took"), **counts)
        )
        histogram = HistogramMetricFamily(
            "zoekt_control_move_duration_seconds",
            "Seconds from a move's decision to its swap, finished moves, by trigger.",
            labels=["trigger"],
        )
        for row in rows:
            buckets = [(str(float(b)), row[f"le_{b}"]) for b in MOVE_DURATION_BUCKETS]
            buckets.append(("+Inf", row["total"]))
            histogram.add_metric(
                [row["trigger"]], buckets, sum_value=row["seconds"].total_seconds()
            )
        return histogram

    def _jobs(self) -> Iterator[Metric]:
        """Runs and durations of every job (``zoekt.jobmetrics``, one Redis round trip)."""
        try:
            figures = jobmetrics.read()
        except Exception as exc:  # Redis away: the fleet's figures are still served
            log.warning("job_metrics_unavailable", error=f"{type(exc).__name__}: {exc}")
            return
        duration = SummaryMetricFamily(
            "zoekt_control_job_duration_seconds",
            "Runs of each job and the seconds they took in all.",
            labels=["job"],
        )
        failures = CounterMetricFamily(
            "zoekt_control_job_failures", "Runs of each job that failed.", labels=["job"]
        )
        last = _gauge(
            "zoekt_control_job_last_duration_seconds",
            "Seconds the last run of each job took.",
            ("job",),
        )
        finished = _gauge(
            "zoekt_control_job_last_finished_timestamp_seconds",
            "When the last run of each job ended (Unix time).",
            ("job",),
        )
        for job in figures:
            duration.add_metric([job.job], count_value=job.runs, sum_value=job.seconds)
            failures.add_metric([job.job], job.failures)
            last.add_metric([job.job], job.last_seconds)
            finished.add_metric([job.job], job.last_finished)
        yield from (duration, failures, last, finished)

    def _node_api(self) -> Iterator[Metric]:
        """Keys the node API ignored (``zoekt.nodeapimetrics``, one Redis round trip)."""
        try:
            rows = nodeapimetrics.read()
        except Exception as exc:  # Redis away: the fleet's figures are still served
            log.warning("node_api_metrics_unavailable", error=f"{type(exc).__name__}: {exc}")
            return
        unknown = CounterMetricFamily(
            "zoekt_control_node_api_unknown_keys",
            "Node API requests that carried a key the endpoint does not declare (ignored), "
            "by endpoint and the key's dotted path.",
            labels=["endpoint", "key"],
        )
        for endpoint, key, requests in rows:
            unknown.add_metric([endpoint, key], requests)
        yield unknown

    def _gitlab_sync(self, now) -> Iterator[Metric]:
        """Following GitLab (docs/gitlab.md): the sweeps and the system hooks' backlog."""
        current = gitlab_status(now)
        hooks = _gauge(
            "zoekt_control_gitlab_hook_events", "System hook events kept, by state.", ("state",)
        )
        for state, count in current.hooks.items():
            hooks.add_metric([state], count)
        lag = _gauge(
            "zoekt_control_gitlab_hook_lag_seconds",
            "How long the oldest due system hook has waited to be refetched (0 with none).",
        )
        lag.add_metric([], current.hook_lag_seconds)
        last = _gauge(
            "zoekt_control_gitlab_last_complete_sweep_timestamp_seconds",
            "When the last complete GitLab sweep finished (absent before the first).",
        )
        if current.last_complete_sweep_at is not None:
            last.add_metric([], current.last_complete_sweep_at.timestamp())
        running = _gauge("zoekt_control_gitlab_sweep_running", "1 while a GitLab sweep is running.")
        sweep = current.last_sweep
        running.add_metric([], 1 if sweep and sweep["state"] == "running" else 0)
        written = _gauge(
            "zoekt_control_gitlab_last_sweep_projects",
            "Projects the last GitLab sweep wrote, skipped and removed.",
            ("what",),
        )
        if sweep:
            written.add_metric(["written"], sweep["projects"])
            written.add_metric(["skipped"], sweep["skipped"])
            written.add_metric(["removed"], sweep["removed_projects"])
        yield from (hooks, lag, last, running, written)


def _bearer_matches(request: HttpRequest, token: str) -> bool:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode(), token.encode()
    )


def _from_allowed_network(request: HttpRequest) -> bool:
    networks = getattr(settings, "ZOEKT_METRICS_ALLOWED_NETWORKS", [])
    if not networks:
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(network, strict=False) for network in networks)


def _staff(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    return bool(user and user.is_active and user.is_staff)


def _authorized(request: HttpRequest) -> bool:
    token = getattr(settings, "ZOEKT_METRICS_TOKEN", None)
    if settings.DEBUG and not token:
        return True
    return (
        (token is not None and _bearer_matches(request, token))
        or _from_allowed_network(request)
        or _staff(request)
    )


def _refusal() -> JsonResponse:
    """401 with the scheme to use when a token is configured; 403 when none is."""
    if getattr(settings, "ZOEKT_METRICS_TOKEN", None):
        response = JsonResponse(
            error_body({"authorization": ["send Authorization: Bearer <ZOEKT_METRICS_TOKEN>"]}),
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return JsonResponse(
        error_body(
            {
                "client": [
                    "this address is not in ZOEKT_METRICS_ALLOWED_NETWORKS and no "
                    "ZOEKT_METRICS_TOKEN is configured"
                ]
            }
        ),
        status=403,
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus text exposition of ``FleetCollector``."""
    if not _authorized(request):
        return _refusal()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


__all__ = ["FleetCollector", "metrics"]
