"""The rebalance replay (``bench/replay_rebalance.py``) on a small catalog.

Both runs as the bench runs them, with sixteen root groups, five quiet minutes
before the join and six hours after convergence: the fleet converges, no
namespace and no search goes dark, no index moves twice, nothing moves after
convergence, and the busiest node ends nearer the lower bound than it was.
"""

from __future__ import annotations

import argparse

import pytest

from bench import replay_rebalance as bench

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = argparse.Namespace(
    seed=25,
    groups=16,
    fill=0.70,
    disk_fill_memory=0.45,
    searches_per_minute=50,
    rate_mib=20.0,
    tick=20.0,
    calm_minutes=5,
    give_up_hours=6.0,
    after_hours=6.0,
    quiet=True,
)


def test_the_minimum_to_move_is_what_lies_above_the_mean():
    class Node:
        def __init__(self, held, size):
            self.fake = type(
                "Fake",
                (),
                {
                    "disk_used_bytes": lambda _self: held,
                    "indexed_bytes": lambda _self: held,
                    "config": type("Config", (), {"disk_total_bytes": size})(),
                },
            )()

    replay = type("Replay", (), {"nodes": {"a": Node(70, 100), "b": Node(10, 100)}})()

    figures = bench.fleet_figures(replay, None)

    assert figures["disk_lower_bound"] == pytest.approx(0.4)
    assert figures["min_bytes_to_move"] == pytest.approx(30)
    assert figures["disk_busiest"] == pytest.approx(0.7)


@pytest.mark.parametrize("label, option", bench.RUNS, ids=["disk", "memory"])
def test_every_target_of_the_replay_holds(label, option):
    _, result = bench.run_once(label, option, ARGS)

    assert result["initial_ready"] is True
    assert result["converged"] is True
    assert result["dark_namespace_minutes"] == 0
    assert result["searches"] > 0 and result["dark_searches"] == 0
    assert result["moves_done"] > 0
    assert result["moves_parked"] == 0 and result["moves_fallen_back"] == 0
    assert result["moved_more_than_once"] == 0
    assert result["moves_in_24h_after"] == 0
    # Every byte a move recorded was built (the nodes may also re-index after the join).
    assert result["bytes_built"] >= result["bytes_moved"] > 0
    dimension = "rss" if option["memory"] else "disk"
    at_join = (
        result["at_join"][f"{dimension}_busiest"] / result["at_join"][f"{dimension}_lower_bound"]
    )
    after = result["after"][f"{dimension}_busiest"] / result["after"][f"{dimension}_lower_bound"]
    assert after < at_join
    assert result["product_after"]["converged"] is True
