"""Seed GitLab-like demo data, enable it for Zoekt, and (unless told not to) roll out.

Idempotent: the catalog is written with the bulk upsert (a second run
creates no row), enabling a root group finds its enabled namespace, and the
settings are saved only when they change. The data is fixed by ``--seed``:
root groups with subgroups, projects spread over them with log-normal
repository sizes. Ids start at ``--id-base`` so they stay clear of other rows.

Memory-aware planning is switched on by setting
``zoekt_node_memory_budget_bytes`` to ``--memory-budget-gib`` when the
setting is unset (a value already set is left alone; ``0`` skips it).
``--index-sizes-file PATH`` writes, for the fake nodes' ``--index-sizes``,
each project's index size: its ``repository_size`` times a factor drawn
from 0.6 to 1.4 (fixed by ``--seed``).

Then it runs one rollout, for nodes that are already online. ``make demo``
passes ``--no-rollout``: its nodes start after this command, and
``manage.py zoekt_demo_drive`` rolls out once they are online.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from django.core.management.base import BaseCommand

from simulator.democatalog import (  # noqa: F401 (re-exported for the demo's callers)
    DEMO_MEMORY_BUDGET_GIB,
    GIB,
    MIB,
    build_catalog,
    index_sizes,
    namespaces_root,
)
from zoekt import app_settings, catalog, operator_actions
from zoekt.audit import Actor
from zoekt.models import EnabledNamespace


def write_index_sizes(path: Path, sizes: dict[int, int]) -> None:
    """``{"<project id>": bytes, ...}``, replaced atomically (the nodes may be reading it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps({str(key): value for key, value in sorted(sizes.items())}))
    os.replace(temporary, path)


def format_gib(value: int) -> str:
    return f"{value / GIB:g} GiB"


class Command(BaseCommand):
    help = (
        "Seed demo groups and projects, enable them for Zoekt, turn indexing on and "
        "memory-aware planning on, roll out."
    )

    def add_arguments(self, parser):
        parser.add_argument("--groups", type=int, default=40)
        parser.add_argument("--projects", type=int, default=400)
        parser.add_argument("--seed", type=int, default=42)
        parser.add_argument("--id-base", type=int, default=900_000)
        parser.add_argument(
            "--memory-budget-gib",
            type=float,
            default=DEMO_MEMORY_BUDGET_GIB,
            metavar="GIB",
            help="set zoekt_node_memory_budget_bytes to this when it is unset, so "
            f"memory-aware planning is on (default {DEMO_MEMORY_BUDGET_GIB:g}; 0: leave it unset)",
        )
        parser.add_argument(
            "--index-sizes-file",
            default=None,
            metavar="PATH",
            help="write each project's index size (JSON, project id → bytes) for the fake "
            "nodes' --index-sizes",
        )
        parser.add_argument(
            "--no-rollout", action="store_true", help="do not run a rollout after seeding"
        )

    def handle(self, *args, groups, projects, seed, id_base, no_rollout, **options):
        storages = catalog.known_repository_storages()
        namespaces, project_rows, statistics = build_catalog(
            groups=groups,
            projects=projects,
            seed=seed,
            id_base=id_base,
            storage="default" if "default" in storages else storages[0],
        )
        counts = catalog.do_bulk_upsert_catalog(namespaces, project_rows, statistics)
        roots = [row["id"] for row in namespaces if row["type"] == "Group" and not row["parent_id"]]
        subgroups = sum(1 for row in namespaces if row["type"] == "Group" and row["parent_id"])
        self.stdout.write(
            f"catalog: {len(roots)} root groups, {subgroups} subgroups, {len(project_rows)} "
            f"projects (namespaces created {counts['namespaces']['created']}, projects "
            f"created {counts['projects']['created']}, statistics created "
            f"{counts['project_statistics']['created']})"
        )

        before = EnabledNamespace.objects.filter(root_namespace_id__in=roots).count()
        actor = Actor.command()
        for root in roots:
            operator_actions.do_enable_namespace(0, root, search=True, actor=actor)
        self.stdout.write(
            f"enabled namespaces: {len(roots)} root groups "
            f"({len(roots) - before} newly enabled, {before} already)"
        )

        row = app_settings.load_row()
        if not (row.zoekt_indexing_enabled and row.zoekt_search_enabled):
            row.zoekt_indexing_enabled = True
            row.zoekt_search_enabled = True
            row.save()
            self.stdout.write("settings: zoekt_indexing_enabled and zoekt_search_enabled turned on")
        else:
            self.stdout.write("settings: indexing and search were on already")
        self.set_memory_budget(row, options["memory_budget_gib"], statistics)
        app_settings.invalidate()

        if options["index_sizes_file"]:
            path = Path(options["index_sizes_file"])
            sizes = index_sizes(statistics, seed)
            write_index_sizes(path, sizes)
            self.stdout.write(
                f"index sizes: {len(sizes)} projects, {format_gib(sum(sizes.values()))} in all, "
                f"written to {path}"
            )

        if no_rollout:
            return
        from planner.tasks import rollout_task

        summary = rollout_task()
        self.stdout.write(f"rollout now: {summary}")

    def set_memory_budget(self, row, budget_gib: float, statistics: list[dict]) -> None:
        ratio = row.zoekt_memory_ratio
        estimate = math.ceil(sum(item["repository_size"] for item in statistics) * ratio)
        figures = (
            f"the catalog's estimate is {format_gib(estimate)} "
            f"(repository sizes × memory_ratio {ratio:g})"
        )
        current = row.zoekt_node_memory_budget_bytes
        if current is not None:
            self.stdout.write(
                f"settings: zoekt_node_memory_budget_bytes was set already "
                f"({format_gib(current)}), left as it is; {figures}"
            )
            return
        if budget_gib <= 0:
            self.stdout.write(
                f"settings: zoekt_node_memory_budget_bytes left unset (memory planning off); "
                f"{figures}"
            )
            return
        row.zoekt_node_memory_budget_bytes = int(budget_gib * GIB)
        row.save()
        self.stdout.write(
            f"settings: zoekt_node_memory_budget_bytes set to {format_gib(int(budget_gib * GIB))} "
            f"(memory-aware planning on); {figures}"
        )
