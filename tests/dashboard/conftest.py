"""Fixtures of the dashboard tests: a frozen clock and plans made by real rollouts."""

from __future__ import annotations

import pytest

from planner.models import RolloutPlan
from planner.rollout import RolloutService
from tests.dashboard.builders import unplaced_namespace


@pytest.fixture
def dry_run_plan(now):
    """Run a dry rollout over ``count`` unplaced namespaces; returns the plan row it kept."""

    def make(*sizes_per_namespace: tuple[int, ...]) -> RolloutPlan:
        for i, sizes in enumerate(sizes_per_namespace):
            unplaced_namespace(f"unplaced-{RolloutPlan.objects.count()}-{i}", sizes)
        RolloutService(record_decisions=True).execute(dry_run=True, batch_size=1_000)
        return RolloutPlan.objects.order_by("-id").first()

    return make
