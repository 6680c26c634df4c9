"""``manage.py zoekt_demo_seed``: demo catalog, enabled root groups, settings on; idempotent."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from zoekt import app_settings
from zoekt.management.commands.zoekt_demo_seed import build_catalog
from zoekt.models import (
    EnabledNamespace,
    Namespace,
    Project,
    ProjectStatistics,
    Replica,
    Task,
)

pytestmark = pytest.mark.django_db


def counts() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (Namespace, Project, ProjectStatistics, EnabledNamespace, Replica, Task)
    }


def seed(*extra: str) -> str:
    out = StringIO()
    call_command(
        "zoekt_demo_seed", "--groups", "6", "--projects", "30", "--no-enqueue", *extra, stdout=out
    )
    return out.getvalue()


def test_seed_creates_the_catalog_enables_roots_and_turns_settings_on():
    output = seed()
    roots = Namespace.objects.filter(type="Group", parent_id__isnull=True)
    assert roots.count() == 6
    assert Project.objects.count() == 30
    assert ProjectStatistics.objects.count() == 30
    assert set(EnabledNamespace.objects.values_list("root_namespace_id", flat=True)) == set(
        roots.values_list("id", flat=True)
    )
    assert all(EnabledNamespace.objects.values_list("search", flat=True))
    row = app_settings.load_row()
    assert row.zoekt_indexing_enabled and row.zoekt_search_enabled
    assert "6 root groups" in output and "30 projects" in output
    assert "rollout now" in output  # no nodes: nothing to place, but it ran


def test_seed_twice_creates_nothing_more():
    seed()
    before = counts()
    output = seed()
    assert counts() == before
    assert "namespaces created 0, projects created 0, statistics created 0" in output
    assert "0 newly enabled" in output
    assert "were on already" in output


def test_catalog_is_fixed_by_the_seed():
    a = build_catalog(groups=5, projects=40, seed=1, id_base=1000, storage="default")
    b = build_catalog(groups=5, projects=40, seed=1, id_base=1000, storage="default")
    assert a == b
    namespaces, projects, statistics = a
    assert len(projects) == len(statistics) == 40
    sizes = sorted(row["repository_size"] for row in statistics)
    assert sizes[-1] > 5 * sizes[len(sizes) // 2]  # a long tail
    # every root group holds a project
    roots = {row["id"] for row in namespaces if row["type"] == "Group" and not row["parent_id"]}
    assert roots <= {row["namespace_id"] for row in projects}
