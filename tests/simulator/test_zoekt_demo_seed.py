"""``manage.py zoekt_demo_seed``: catalog, enabled roots, settings, index sizes; idempotent."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from simulator.management.commands.zoekt_demo_seed import (
    DEMO_MEMORY_BUDGET_GIB,
    build_catalog,
    index_sizes,
)
from zoekt import app_settings
from zoekt.models import (
    EnabledNamespace,
    Namespace,
    Project,
    ProjectStatistics,
    Replica,
    Task,
)

pytestmark = pytest.mark.django_db

GIB = 1024**3


def counts() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (Namespace, Project, ProjectStatistics, EnabledNamespace, Replica, Task)
    }


def seed(*extra: str) -> str:
    out = StringIO()
    call_command("zoekt_demo_seed", "--groups", "6", "--projects", "30", *extra, stdout=out)
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


def test_no_rollout_skips_the_rollout():
    output = seed("--no-rollout")
    assert "rollout now" not in output
    assert Replica.objects.count() == 0


def test_seed_sets_the_memory_budget_when_unset_and_only_then():
    assert app_settings.load_row().zoekt_node_memory_budget_bytes is None
    output = seed()
    assert app_settings.current().node_memory_budget_bytes == int(DEMO_MEMORY_BUDGET_GIB * GIB)
    assert "zoekt_node_memory_budget_bytes set to 2 GiB (memory-aware planning on)" in output

    output = seed("--memory-budget-gib", "7")  # set already: left alone, and said so
    assert app_settings.current().node_memory_budget_bytes == 2 * GIB
    assert "was set already (2 GiB), left as it is" in output


def test_seed_leaves_an_operator_budget_alone():
    row = app_settings.load_row()
    row.zoekt_node_memory_budget_bytes = 5 * GIB
    row.save()
    output = seed()
    assert app_settings.load_row().zoekt_node_memory_budget_bytes == 5 * GIB
    assert "was set already (5 GiB)" in output


def test_memory_budget_zero_leaves_memory_planning_off():
    output = seed("--memory-budget-gib", "0")
    assert app_settings.load_row().zoekt_node_memory_budget_bytes is None
    assert "left unset (memory planning off)" in output


def test_seed_writes_index_sizes_that_follow_repository_sizes(tmp_path):
    path = tmp_path / "var" / "sizes.json"
    output = seed("--no-rollout", "--index-sizes-file", str(path))
    written = json.loads(path.read_text())
    repository_size = dict(ProjectStatistics.objects.values_list("project_id", "repository_size"))
    assert (
        {int(key) for key in written}
        == set(repository_size)
        == set(Project.objects.values_list("id", flat=True))
    )
    factors = [written[str(pid)] / size for pid, size in repository_size.items()]
    assert all(0.6 - 1e-6 <= factor <= 1.4 for factor in factors)
    assert max(factors) - min(factors) > 0.2  # drawn, not one constant factor
    assert "index sizes: 30 projects" in output and str(path) in output

    first = path.read_text()
    seed("--no-rollout", "--index-sizes-file", str(path))
    assert path.read_text() == first  # fixed by --seed


def test_index_sizes_are_fixed_by_the_seed():
    _, _, statistics = build_catalog(groups=3, projects=20, seed=5, id_base=0, storage="default")
    assert index_sizes(statistics, 5) == index_sizes(statistics, 5)
    assert index_sizes(statistics, 5) != index_sizes(statistics, 6)
