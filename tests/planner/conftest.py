"""The planner core's tests are pure Python: they need no database, cache or settings.

The database edge's tests (loader, apply, rollout, selection, plan records,
``zoekt_plan``) live here too and get the suite's clean cache.
"""

import pytest

from tests.conftest import clean_cache


@pytest.fixture(autouse=True)
def _clean_cache(request):
    """Override the suite-wide cache fixture for the tests that touch no Django."""
    if request.node.get_closest_marker("django_db") or "db" in request.fixturenames:
        yield from clean_cache()
    else:
        yield
