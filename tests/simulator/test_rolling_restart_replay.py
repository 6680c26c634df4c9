"""The rolling-restart replay (``bench/replay_rolling_restart.py``) on a small catalog.

The product's run, as the bench runs it but with eight root groups and ten
quiet minutes before the first restart: its targets hold (nothing handled as
lost, nothing re-indexed, no two-replica namespace dark, one-replica
namespaces dark no longer than their node is down). GitLab's run (a node
lost, then back truncated and empty) is ``test_replay_restart``'s.
"""

from __future__ import annotations

import argparse

import pytest

from bench import replay_rolling_restart as bench

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = argparse.Namespace(
    seed=25, groups=8, searches_per_minute=50, rate_mib=20.0, tick=20.0, calm_minutes=10, quiet=True
)


def test_half_the_roots_get_two_replicas_whatever_their_order():
    roots = {root: f"g{root}" for root in range(100, 120)}

    doubled = bench.two_replica_roots(roots, seed=25)

    assert len(doubled) == 10 and doubled <= set(roots)
    assert doubled == bench.two_replica_roots(dict(reversed(roots.items())), seed=25)
    assert doubled != bench.two_replica_roots(roots, seed=26)


def test_with_restart_records_every_target_of_the_replay_holds():
    label, option = next(run for run in bench.RUNS if run[1]["restart_records"])
    _, result = bench.run_once(label, option, ARGS)

    assert result["initial_ready"] is True
    assert [turn["settled"] for turn in result["turns"]] == [True] * len(bench.NODES)
    assert result["nodes_handled_as_lost"] == 0
    assert result["bytes_reindexed"] == 0
    assert result["dark_namespace_minutes_two_replicas"] == 0
    assert result["routed_to_down_namespace_minutes_two_replicas"] == 0
    # One-replica namespaces: dark while their node is down, and no longer.
    assert result["dark_namespace_minutes_one_replica"] > 0
    for turn in result["turns"]:
        dark = result["one_replica_dark_minutes_by_turn"].get(turn["node"], 0.0)
        down_minutes = bench.DOWN_SECONDS / 60
        # From the first tick it is seen offline to the tick it is back: the 20 minutes
        # less the tick during which it still looks online.
        assert dark == pytest.approx(
            turn["one_replica_namespaces"] * (down_minutes - ARGS.tick / 60)
        )
        assert turn["node_id_after"] == turn["node_id"]
    assert result["layout_unchanged"] is True
    assert result["shutdown_records"] == [("complete", "node_returned")] * len(bench.NODES)
