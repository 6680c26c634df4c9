"""The planner core is pure Python: these tests need no database, cache or settings."""

import pytest


@pytest.fixture(autouse=True)
def _clean_cache():
    """Override the suite-wide cache fixture: nothing here touches Django."""
    yield
