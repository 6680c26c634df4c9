"""The demo's fleet converges: the seeded catalog on five fake nodes reaches ready on all five.

``make demo`` runs this with real processes (web, worker, beat, fake nodes,
the driver); here the same seed, settings and node parameters run through
``simulator.replay`` on a simulated clock, so the outcome is checked on every
CI run: every enabled namespace gets a ready replica and every one of the
five nodes holds ready indices (memory-aware planning spreads them).
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from simulator.democatalog import build_catalog, index_sizes
from simulator.demoprogress import demo_progress
from simulator.fakenode import GIB, default_index_size
from simulator.replay import Replay
from zoekt.models import EnabledNamespace, Index, Replica

pytestmark = pytest.mark.django_db(transaction=True)

NODES = 5


def test_the_demo_catalog_converges_on_five_nodes_and_uses_all_of_them():
    call_command("zoekt_demo_seed", "--no-rollout", stdout=io.StringIO())
    # The same sizes the seed writes for the fake nodes (its defaults: seed 42).
    _, _, statistics = build_catalog(
        groups=40, projects=400, seed=42, id_base=900_000, storage="default"
    )
    sizes = index_sizes(statistics, 42)
    with Replay(
        index_size=lambda repo_id: sizes.get(repo_id) or default_index_size(repo_id),
        default_hotness=0.2,
    ) as replay:
        for i in range(NODES):
            replay.add_node(
                f"zoekt-{i}",
                disk_total_bytes=25 * GIB,
                disk_base_used_bytes=2 * GIB,
                memory_limit_bytes=2 * GIB,
            )
        converged = replay.run(2 * 3600, until=lambda r: demo_progress().converged)

    assert converged, demo_progress()
    progress = demo_progress()
    assert progress.enabled_namespaces == EnabledNamespace.objects.count() == 40
    assert progress.namespaces_ready == 40
    assert Replica.objects.exclude(state=Replica.State.READY).count() == 0
    assert len(progress.ready_indices_per_node) == NODES
    assert all(count > 0 for count in progress.ready_indices_per_node.values())
    assert Index.objects.exclude(state=Index.State.READY).count() == 0
