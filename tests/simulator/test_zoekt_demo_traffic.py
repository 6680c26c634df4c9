"""zoekt_demo_traffic: searches drawn by hotness, answered by search_targets, dark ones counted."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from simulator.management.commands.zoekt_demo_traffic import (
    TrafficCounts,
    TrafficLoop,
    enabled_namespace_ids,
    prometheus_counters,
)
from tests.factories import EnabledNamespaceFactory, IndexFactory, NodeFactory, ReplicaFactory
from zoekt.models import Index, Replica


def test_every_search_is_counted_and_the_dark_ones_by_reason():
    answers = {1: None, 2: "no_ready_replica", 3: "no_searchable_replica"}
    seen = []
    loop = TrafficLoop(
        rate=500,
        hotness=lambda ns: {1: 5.0, 2: 3.0, 3: 2.0}[ns],
        namespaces=lambda: [1, 2, 3],
        reasons_for=lambda ids: {ns: answers[ns] for ns in ids},
        on_counts=lambda n, dark: seen.append((n, dict(dark))),
    )
    first = loop.tick(0)
    assert first.searches == 500
    # Namespace 1 answers, 2 and 3 do not: their draws are the dark ones, by reason.
    assert set(first.dark) == {"no_ready_replica", "no_searchable_replica"}
    share = first.dark_total / first.searches
    assert 0.4 < share < 0.6  # weights 3 + 2 of 10
    assert first.dark["no_ready_replica"] > first.dark["no_searchable_replica"]
    loop.tick(1)
    assert loop.counts.searches == 1000
    assert loop.counts.dark_total == sum(sum(d.values()) for _, d in seen)
    assert [n for n, _ in seen] == [500, 500]


def test_the_same_second_draws_the_same_searches():
    def make():
        return TrafficLoop(
            rate=50,
            hotness=lambda ns: 1.0 / ns,
            namespaces=lambda: [1, 2, 3, 4],
            reasons_for=lambda ids: {ns: "no_ready_replica" if ns % 2 else None for ns in ids},
        )

    assert make().tick(7) == make().tick(7)


def test_no_namespace_no_search():
    loop = TrafficLoop(rate=10, namespaces=list, reasons_for=lambda ids: 1 / 0)
    assert loop.tick(0) == TrafficCounts()


def test_counts_text():
    counts = TrafficCounts(searches=200)
    counts.dark.update({"no_ready_replica": 30, "no_searchable_replica": 20})
    assert counts.text() == (
        "searches 200, dark 50 (25.0%): no_ready_replica 30, no_searchable_replica 20"
    )


def test_the_report_gives_the_last_interval_then_the_totals_and_starts_a_new_interval():
    # Namespace 2 is dark for the first two seconds only (not ready yet), then answers.
    dark_until = {"second": 2}
    loop = TrafficLoop(
        rate=100,
        hotness=lambda ns: 1.0,
        namespaces=lambda: [1, 2],
        reasons_for=lambda ids: {1: None, 2: "no_ready_replica" if dark_until["second"] else None},
    )
    early = [loop.tick(0), loop.tick(1)]
    dark_early = sum(counts.dark_total for counts in early)
    assert 0 < dark_early < 200
    first = loop.report(2)
    assert first.startswith(f"last 2 s: searches 200, dark {dark_early} (")
    assert first.endswith(
        f"since start: searches 200, dark {dark_early} "
        f"({dark_early / 2:.1f}%): no_ready_replica {dark_early}"
    )

    dark_until["second"] = 0
    for second in range(2, 32):
        loop.tick(second)
    later = loop.report(30)
    last, _, total = later.partition(" · since start: ")
    # Nothing dark in the last 30 s, whatever the totals still carry from before.
    assert last == "last 30 s: searches 3,000, dark 0 (0.0%)"
    assert total.startswith(f"searches 3,200, dark {dark_early} (")
    assert loop.report(30).startswith("last 30 s: searches 0, dark 0 (0.0%)")


@pytest.mark.django_db
def test_searches_are_answered_by_search_targets(now):
    online = NodeFactory()
    served = ReplicaFactory(state=Replica.State.READY)
    IndexFactory(zoekt_replica=served, zoekt_node=online, state=Index.State.READY)
    waiting = EnabledNamespaceFactory()  # enabled, no replica yet
    EnabledNamespaceFactory(search=False)  # not searched: never drawn
    ids = enabled_namespace_ids()
    assert ids == sorted([served.namespace_id, waiting.root_namespace_id])

    loop = TrafficLoop(rate=400, hotness=lambda ns: 1.0)
    counts = loop.tick(3)
    assert counts.searches == 400
    assert set(counts.dark) == {"no_ready_replica"}
    assert 100 < counts.dark_total < 300  # about half: the waiting namespace's share


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_counters_are_served_for_prometheus():
    port = free_port()
    add = prometheus_counters(port)
    add(120, {"no_ready_replica": 7})
    add(30, {})
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "zoekt_simulator_searches_total 150.0" in text
    assert 'zoekt_simulator_dark_searches_total{reason="no_ready_replica"} 7.0' in text
