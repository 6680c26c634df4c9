"""The drain replay (``bench/replay_drain.py``) on a small catalog.

Both runs as the bench runs them, with eight root groups and five quiet
minutes before the request: the record completes, no namespace and no
search goes dark, no node left reaches the high watermark, every move is
done (none parked, none fallen back), and a replace puts every replacement
on the named node.
"""

from __future__ import annotations

import argparse

import pytest

from bench import replay_drain as bench
from zoekt import capacity

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = argparse.Namespace(
    seed=25,
    groups=8,
    fill=0.55,
    searches_per_minute=50,
    rate_mib=20.0,
    tick=20.0,
    calm_minutes=5,
    give_up_hours=2.0,
    quiet=True,
)


def test_node_size_fills_five_nodes_to_the_share_asked():
    projects = [(1, 10, 10 * 1024**3), (2, 10, 5 * 1024**3)]  # 45 GiB of index

    size = bench.node_size(projects, 0.5)

    assert size == 18 * 1024**3  # 45 GiB ÷ (5 × 0.5), to the GiB above


@pytest.mark.parametrize(
    "label, option", bench.RUNS, ids=[option["type"] for _, option in bench.RUNS]
)
def test_every_target_of_the_replay_holds(label, option):
    _, result = bench.run_once(label, option, ARGS)

    assert result["initial_ready"] is True
    assert result["complete"] is True
    assert result["statuses"][-1][1:] == ("complete", "node_drained")
    assert result["drained_bytes"] > 0
    assert result["drained_bytes_after"] == 0
    assert result["bytes_moved"] == result["drained_bytes"]
    assert result["dark_namespace_minutes"] == 0
    assert result["searches"] > 0 and result["dark_searches"] == 0
    assert result["peak_share_max"] < capacity.WATERMARK_LIMIT_HIGH
    assert result["busiest_after"] < capacity.WATERMARK_LIMIT_HIGH
    assert result["busiest_after"] >= result["lower_bound"]
    assert result["moves_parked"] == 0 and result["moves_fallen_back"] == 0
    # Never faster than the physical bound: the bytes over the slots' indexing.
    assert result["time_to_complete_s"] >= result["bound_s"]
    if option["type"] == "replace":
        assert result["share_on_target"] == 1.0
        assert result["moves_by_target"][bench.NEW_NODE] == result["moves_done"]
    else:
        assert result["share_on_target"] is None
        assert result["moves_by_target"][bench.DRAINED] == 0
