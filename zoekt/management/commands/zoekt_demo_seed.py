"""Seed GitLab-like demo data, enable it for Zoekt, and start a rollout (``make demo``).

Idempotent: the catalog is written with the bulk upsert (a second run
creates no row), enabling a root group finds its enabled namespace, and the
settings are saved only when they change. The data is fixed by ``--seed``:
root groups with subgroups, projects spread over them with log-normal
repository sizes. Ids start at ``--id-base`` so they stay clear of other rows.

After seeding it runs one rollout at once (the beat's runs every 10 min) and,
unless ``--no-enqueue``, enqueues more a little later for nodes that
register after this command (the fake nodes of ``make demo`` start with the
web server). ``--kick-scheduling 10`` (used by ``make demo``) also enqueues a
scheduling run every 10 s for the first minutes: the beat's run once a
minute and each starts at most one pending index per node (GitLab's limit),
so without it a demo takes many minutes to converge.
"""

from __future__ import annotations

import math
import random

from django.core.management.base import BaseCommand

from zoekt import app_settings, operator_actions
from zoekt.models import EnabledNamespace

MIB = 1024**2


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
        namespaces.append(
            {
                "id": next_id,
                "name": name,
                "path": name,
                "type": "Group",
                "parent_id": parent_id,
                "visibility_level": 20,
                "archived": False,
            }
        )
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
        namespaces.append(
            {
                "id": next_id,
                "name": name,
                "path": name,
                "type": "Project",
                "parent_id": holder,
                "visibility_level": 20,
                "archived": False,
            }
        )
        project_rows.append(
            {
                "id": project_id,
                "name": name,
                "path": name,
                "namespace_id": holder,
                "project_namespace_id": next_id,
                "visibility_level": 20,
                "archived": False,
                "repository_storage": storage,
                "repository_access_level": 20,
                "forked_from_project_id": None,
            }
        )
        # Log-normal sizes: a median of 20 MiB, a long tail of large repositories.
        size = int(min(rng.lognormvariate(math.log(20 * MIB), 1.2), 4 * 1024 * MIB))
        statistics.append(
            {
                "project_id": project_id,
                "repository_size": max(size, 64 * 1024),
                "storage_size": int(max(size, 64 * 1024) * rng.uniform(1.1, 1.6)),
            }
        )
    return namespaces, project_rows, statistics


def namespaces_root(namespaces: list[dict], g: int) -> int:
    roots = [row["id"] for row in namespaces if row["type"] == "Group" and not row["parent_id"]]
    return roots[g % len(roots)]


class Command(BaseCommand):
    help = "Seed demo groups and projects, enable them for Zoekt, turn indexing on, roll out."

    def add_arguments(self, parser):
        parser.add_argument("--groups", type=int, default=40)
        parser.add_argument("--projects", type=int, default=400)
        parser.add_argument("--seed", type=int, default=42)
        parser.add_argument("--id-base", type=int, default=900_000)
        parser.add_argument(
            "--no-rollout", action="store_true", help="do not run a rollout after seeding"
        )
        parser.add_argument(
            "--kick-scheduling",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="demo speed-up: also enqueue a scheduling run every SECONDS for --kick-for "
            "seconds (the beat's runs are a minute apart and start one index per node each)",
        )
        parser.add_argument("--kick-for", type=float, default=180.0, metavar="SECONDS")
        parser.add_argument(
            "--no-enqueue",
            action="store_true",
            help="do not enqueue delayed rollouts for nodes that register later",
        )

    def handle(self, *args, groups, projects, seed, id_base, no_rollout, no_enqueue, **options):
        kick_every, kick_for = options["kick_scheduling"], options["kick_for"]
        storages = operator_actions.known_repository_storages()
        namespaces, project_rows, statistics = build_catalog(
            groups=groups,
            projects=projects,
            seed=seed,
            id_base=id_base,
            storage="default" if "default" in storages else storages[0],
        )
        counts = operator_actions.do_bulk_upsert_catalog(namespaces, project_rows, statistics)
        roots = [row["id"] for row in namespaces if row["type"] == "Group" and not row["parent_id"]]
        subgroups = sum(1 for row in namespaces if row["type"] == "Group" and row["parent_id"])
        self.stdout.write(
            f"catalog: {len(roots)} root groups, {subgroups} subgroups, {len(project_rows)} "
            f"projects (namespaces created {counts['namespaces']['created']}, projects "
            f"created {counts['projects']['created']}, statistics created "
            f"{counts['project_statistics']['created']})"
        )

        before = EnabledNamespace.objects.filter(root_namespace_id__in=roots).count()
        for root in roots:
            operator_actions.do_enable_namespace(0, root, search=True)
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
        app_settings.invalidate()

        if no_rollout:
            return
        from planner.tasks import rollout_task

        summary = rollout_task()
        self.stdout.write(f"rollout now: {summary}")
        if not no_enqueue:
            # Nodes starting alongside the web server register within seconds.
            for countdown in (20, 45, 90):
                rollout_task.apply_async(countdown=countdown)
            self.stdout.write("rollouts enqueued in 20 s, 45 s and 90 s for nodes registering now")
            if kick_every > 0:
                from zoekt.scheduling.tasks import scheduling_task

                countdowns = [kick_every * i for i in range(1, int(kick_for // kick_every) + 1)]
                for countdown in countdowns:
                    scheduling_task.apply_async(countdown=countdown, expires=countdown + 60)
                self.stdout.write(
                    f"scheduling runs enqueued every {kick_every:g} s for {kick_for:g} s "
                    f"({len(countdowns)} runs; the beat's continue every minute)"
                )
