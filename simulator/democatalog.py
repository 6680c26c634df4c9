"""The demo's catalog: groups and projects of log-normal sizes, fixed by a seed (no Django).

``manage.py zoekt_demo_seed`` upserts it; ``bench/placement.py`` plans it.
"""

from __future__ import annotations

import math
import random

from zoekt import catalog_rows

MIB = 1024**2
GIB = 1024**3

# The demo's per-node memory budget: about 1.25 × the catalog's memory estimate
# (≈ 8.1 GiB with the default catalog) over five nodes, rounded (README, "Demo").
DEMO_MEMORY_BUDGET_GIB = 2.0


def build_catalog(
    *, groups: int, projects: int, seed: int, id_base: int, storage: str
) -> tuple[list[dict], list[dict], list[dict]]:
    """Namespaces, projects and statistics rows of the bulk upsert; fixed by ``seed``."""
    rng = random.Random(seed)
    namespaces: list[dict] = []
    holders: list[int] = []  # groups and subgroups that can hold projects
    next_id = id_base

    def group(name: str, parent_id: int | None) -> int:
        nonlocal next_id
        next_id += 1
        namespaces.append(catalog_rows.group_row(next_id, name, parent_id))
        holders.append(next_id)
        return next_id

    for g in range(groups):
        root = group(f"demo-group-{g:03d}", None)
        for s in range(rng.randint(0, 3)):
            sub = group(f"demo-group-{g:03d}-sub-{s}", root)
            if rng.random() < 0.3:
                group(f"demo-group-{g:03d}-sub-{s}-team", sub)

    project_rows: list[dict] = []
    statistics: list[dict] = []
    project_id = id_base + 500_000
    for p in range(projects):
        # Every root group gets a project first, then they go anywhere.
        holder = namespaces_root(namespaces, p) if p < groups else rng.choice(holders)
        next_id += 1
        project_id += 1
        name = f"demo-project-{p:04d}"
        # Log-normal sizes: a median of 20 MiB, a long tail of large repositories.
        size = int(min(rng.lognormvariate(math.log(20 * MIB), 1.2), 4 * 1024 * MIB))
        size = max(size, 64 * 1024)
        rows = catalog_rows.project_rows(
            project_id,
            name,
            namespace_id=holder,
            project_namespace_id=next_id,
            repository_size=size,
            storage_size=int(size * rng.uniform(1.1, 1.6)),
            repository_storage=storage,
        )
        for table, row in zip((namespaces, project_rows, statistics), rows, strict=True):
            table.append(row)
    return namespaces, project_rows, statistics


def namespaces_root(namespaces: list[dict], g: int) -> int:
    roots = [row["id"] for row in namespaces if row["type"] == "Group" and not row["parent_id"]]
    return roots[g % len(roots)]


def index_sizes(statistics: list[dict], seed: int) -> dict[int, int]:
    """Project id → index bytes: ``repository_size`` × a factor in [0.6, 1.4], fixed by ``seed``."""
    rng = random.Random(f"index-sizes-{seed}")
    return {
        row["project_id"]: int(row["repository_size"] * rng.uniform(0.6, 1.4)) for row in statistics
    }
