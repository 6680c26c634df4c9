"""The initial indexing replay (``bench/replay_initial_indexing.py``) on a small catalog.

Both hand-outs as the bench runs them, with 60 root groups on its 10 nodes: every
namespace becomes searchable, admission control sooner than GitLab's one pending index
per node a minute, and no node near the high watermark at any tick.
"""

from __future__ import annotations

import argparse

import pytest

from bench import replay_initial_indexing as bench

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = argparse.Namespace(seed=7, groups=60, rate_mib=2.0, tick=10.0, give_up_hours=3.0, quiet=True)


def test_admission_control_makes_every_namespace_searchable_sooner_than_gitlabs_rule():
    gitlab = bench.run_once("GitLab's rule", "gitlab", ARGS)
    admitted = bench.run_once("admission control", "admission", ARGS)

    assert gitlab["searchable"] and admitted["searchable"]
    assert admitted["time_to_searchable_s"] < gitlab["time_to_searchable_s"]
    assert admitted["time_to_searchable_s"] >= admitted["bound_s"]
    for run in (gitlab, admitted):
        assert run["peak_disk_share"] < bench.HIGH
        # Every project was built at least once, and the catalog is the bench's.
        assert run["tasks_done"] >= run["projects"] > run["namespaces"] == 60
