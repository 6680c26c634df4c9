"""The force re-index replay (``bench/replay_force_reindex.py``) at a 25th of its scale.

The incident's shape with 20 namespaces and 190 projects in place of 495 and 4,708 (the
index, the node and every share scaled with them, so a build takes the same share of the
disk), the old shards freed 12 hours after their rebuild: GitLab's pacing takes the node
past the high watermark, as in the incident; admission control never does, and finishes
within 1.5× of the earliest any pacing that stays under it could.
"""

from __future__ import annotations

import argparse

import pytest

from bench import replay_force_reindex as bench

pytestmark = pytest.mark.django_db(transaction=True)

SCALE = 190 / bench.PROJECTS

ARGS = argparse.Namespace(seed=3, tick=60.0, give_up_hours=30.0, linger_hours=12.0, quiet=True)


@pytest.fixture
def small_incident(monkeypatch):
    monkeypatch.setattr(bench, "NAMESPACES", 20)
    monkeypatch.setattr(bench, "PROJECTS", 190)
    monkeypatch.setattr(bench, "INDEX_GIB", bench.INDEX_GIB * SCALE)
    monkeypatch.setattr(bench, "NODE_GIB", bench.NODE_GIB * SCALE)


def test_admission_control_keeps_the_node_under_the_high_watermark_where_gitlabs_pacing_does_not(
    small_incident,
):
    gitlab = bench.run_once("GitLab's pacing", "gitlab", True, ARGS)
    admitted = bench.run_once("admission control", "admission", True, ARGS)

    for run in (gitlab, admitted):
        assert run["finished"]
        assert run["forced_done"] == run["forced_tasks"] == 190
        assert run["evictions_applied"] == 0
    assert gitlab["peak_share"] > bench.HIGH
    assert admitted["peak_share"] < bench.HIGH
    assert 1.0 <= admitted["over_disk_bound"] <= 1.5
