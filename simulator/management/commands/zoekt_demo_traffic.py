"""Search traffic for ``make demo``: searches drawn by namespace hotness, dark ones counted.

Every second it draws ``--rate`` searches over the enabled namespaces in
proportion to their hotness (a Zipf law fixed by a hash of the namespace id:
the same ``ZipfHotness`` the demo's fake nodes use for their memory) and
answers each as a search would be routed, with ``zoekt.search_targets``
(``search_targets_many``: every namespace's answer of that second, in four
queries). A
search with no target is **dark**; its reason (``no_ready_replica``,
``no_searchable_replica``, ...) is counted too.

The counts are served for Prometheus on ``--metrics-port`` (9101; 0 turns it
off) as ``zoekt_simulator_searches_total`` and
``zoekt_simulator_dark_searches_total{reason}``, a registry of this process
only (the control plane's ``/metrics`` is about the fleet, not about a
simulator), and printed every ``--report-every`` seconds: the searches and
dark ones of the last interval, then the totals since start (the totals keep
the dark searches of the minute before convergence forever; the interval says
whether any are dark now). It runs until SIGTERM or SIGINT and exits 0 (honcho
stops every process when one exits).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from simulator.models import ZipfHotness, generate_searches


def enabled_namespace_ids() -> list[int]:
    from zoekt.models import EnabledNamespace

    return list(
        EnabledNamespace.objects.filter(search=True)
        .order_by("root_namespace_id")
        .values_list("root_namespace_id", flat=True)
    )


def dark_reasons(namespace_ids: list[int]) -> dict[int, str | None]:
    """Per namespace, None when a search has targets, else why it has none (four queries)."""
    from zoekt.search_targets import search_targets_many

    return {
        namespace_id: None if answer.targets else str(answer.reason)
        for namespace_id, answer in search_targets_many(namespace_ids).items()
    }


@dataclasses.dataclass
class TrafficCounts:
    searches: int = 0
    dark: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def dark_total(self) -> int:
        return sum(self.dark.values())

    def add(self, other: TrafficCounts) -> None:
        self.searches += other.searches
        self.dark.update(other.dark)

    def text(self) -> str:
        share = 100 * self.dark_total / self.searches if self.searches else 0.0
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(self.dark.items()))
        return f"searches {self.searches:,}, dark {self.dark_total:,} ({share:.1f}%)" + (
            f": {reasons}" if reasons else ""
        )


@dataclasses.dataclass
class TrafficLoop:
    """One second of traffic per ``tick(second)``; the namespaces and answers are injectable."""

    rate: int = 20
    hotness: Callable[[int], float] = dataclasses.field(default_factory=lambda: ZipfHotness(s=0.4))
    namespaces: Callable[[], list[int]] = enabled_namespace_ids
    reasons_for: Callable[[list[int]], Mapping[int, str | None]] = dark_reasons
    on_counts: Callable[[int, Mapping[str, int]], None] | None = None
    counts: TrafficCounts = dataclasses.field(default_factory=TrafficCounts)
    #: The counts since the last ``report`` (all of them before the first).
    interval: TrafficCounts = dataclasses.field(default_factory=TrafficCounts)

    def tick(self, second: int) -> TrafficCounts:
        """Draw this second's searches; returns the counts of this second alone."""
        ids = self.namespaces()
        weights = {ns: self.hotness(ns) for ns in ids}
        reasons = self.reasons_for(ids) if ids else {}
        drawn = generate_searches(
            weights, lambda ns: () if reasons[ns] else (ns,), self.rate, seed=second
        )
        now = TrafficCounts(searches=drawn.searches)
        for ns, count in drawn.dark_by_namespace.items():
            now.dark[reasons[ns]] += count
        self.counts.add(now)
        self.interval.add(now)
        if self.on_counts is not None:
            self.on_counts(now.searches, now.dark)
        return now

    def report(self, seconds: float) -> str:
        """The report line's text: the last ``seconds``' counts, then the totals; starts a
        new interval."""
        text = f"last {seconds:.0f} s: {self.interval.text()} · since start: {self.counts.text()}"
        self.interval = TrafficCounts()
        return text


def prometheus_counters(port: int) -> Callable[[int, Mapping[str, int]], None]:
    """Serve the two counters on ``port``; returns the function that adds to them."""
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    registry = CollectorRegistry()
    searches = Counter(
        "zoekt_simulator_searches",
        "Searches the demo's traffic generator sent",
        registry=registry,
    )
    dark = Counter(
        "zoekt_simulator_dark_searches",
        "Searches that found no target, by the reason search_targets gave",
        ["reason"],
        registry=registry,
    )
    start_http_server(port, addr="127.0.0.1", registry=registry)

    def add(count: int, dark_by_reason: Mapping[str, int]) -> None:
        searches.inc(count)
        for reason, n in dark_by_reason.items():
            dark.labels(reason=reason).inc(n)

    return add


class Command(BaseCommand):
    help = "Demo: search traffic by namespace hotness; counts the searches with no target."

    def add_arguments(self, parser):
        parser.add_argument("--rate", type=int, default=20, help="searches a second (20)")
        parser.add_argument("--zipf-s", type=float, default=0.4, help="hotness exponent (0.4)")
        parser.add_argument("--seed", type=int, default=0, help="hotness seed (the nodes' seed)")
        parser.add_argument("--metrics-port", type=int, default=9101, help="0: no endpoint")
        parser.add_argument("--report-every", type=float, default=30.0, metavar="SECONDS")

    def handle(self, *args, rate, zipf_s, seed, metrics_port, report_every, **options):
        if rate < 1:
            self.stderr.write("--rate must be at least 1")
            raise SystemExit(2)
        logging.getLogger().setLevel(logging.WARNING)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda _s, _f: stop.set())
        on_counts = prometheus_counters(metrics_port) if metrics_port else None
        loop = TrafficLoop(rate=rate, hotness=ZipfHotness(s=zipf_s, seed=seed), on_counts=on_counts)
        where = f"; counters at http://127.0.0.1:{metrics_port}/metrics" if metrics_port else ""
        self.stdout.write(f"[traffic] {rate} searches a second by namespace hotness{where}")
        started = last_report = time.monotonic()
        second = 0
        while not stop.is_set():
            close_old_connections()
            try:
                loop.tick(second)
            except Exception as exc:  # the database restarting, say: try again next second
                self.stderr.write(f"[traffic] failed: {exc.__class__.__name__}: {exc}")
            second += 1
            now = time.monotonic()
            if now - last_report >= report_every:
                line = loop.report(now - last_report)
                last_report = now
                self.stdout.write(f"[traffic] {int(now - started)} s: {line}")
                self.stdout.flush()
            stop.wait(max(started + second - time.monotonic(), 0.0))
        close_old_connections()
