"""Rollout benchmark: load, plan and apply end to end on PostgreSQL, then the pure planner.

Run it with PostgreSQL and Redis available::

    python -m config.devservers exec -- .venv/bin/python bench/planner.py

(1) End to end. In a scratch database ``<DATABASE_URL name>_bench`` (dropped
    and created again, migrated) it seeds with COPY a fleet of ``--nodes``
    online search nodes (200) and ``--namespaces`` enabled root groups (2,000)
    holding ``--projects`` projects (200,000; heavy-tailed namespace sizes,
    log-normal repository sizes around 24 MiB, 1 in 20 without statistics),
    sized so the plan fills about 70% of the nodes. Then it runs one real
    rollout batch covering every namespace, as the job does (one transaction
    under the ``ROLLOUT`` advisory lock, ``RolloutService.execute(dry_run=False,
    batch_size=namespaces)``) and reports, per phase (lock, clean-up, select,
    load, plan, log, apply, re-select), the seconds and the SQL statements
    executed (counted with ``connection.execute_wrapper``; the project
    cursor's FETCH round trips are listed apart). It does this for each of
    ``--project-counts`` (20,000 and 200,000) on the same number of
    namespaces, so the statement counts can be compared: they must not move
    with the number of projects.
(2) The pure planner: ``bench/planner_core.py``'s seeded synthetic scenarios
    of 100,000 and 1,000,000 projects on 200 nodes, parsed once and planned
    ``--runs`` times (best time).

Results print as Markdown tables (and JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import random
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# ``python bench/planner.py`` puts bench/ first on the path, where this file
# would shadow the ``planner`` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.scratch import after_copy, setup_django  # noqa: E402

SEED = 20260301
FILL = 0.7
STAMP = "2026-01-01T00:00:00Z"
GROUP_ID_BASE = 1
PROJECT_NAMESPACE_ID_BASE = 10_000_000


# ----------------------------------------------------------------------------
# The fleet
# ----------------------------------------------------------------------------


def namespace_sizes(namespaces: int, projects: int, rng: random.Random) -> list[int]:
    """Heavy-tailed project counts per namespace, summing to ``projects``."""
    weights = [rng.paretovariate(1.1) for _ in range(namespaces)]
    scale = projects / sum(weights)
    counts = [max(1, int(w * scale)) for w in weights]
    cap = max(1, projects // 20)
    counts = [min(c, cap) for c in counts]
    left = projects - sum(counts)
    i = 0
    while left != 0:  # spread the rounding (and the capped tail) over everyone
        step = 1 if left > 0 else -1
        if step > 0 or counts[i % namespaces] > 1:
            counts[i % namespaces] += step
            left -= step
        i += 1
    return counts


def seed(url: str, *, namespaces: int, projects: int, nodes: int) -> dict:
    """COPY the fleet into the (empty) scratch database; returns what was seeded."""
    import psycopg

    rng = random.Random(SEED + projects)
    counts = namespace_sizes(namespaces, projects, rng)
    demand = 0
    without_statistics = 0
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        cursor.execute(
            "TRUNCATE zoekt_indices, zoekt_replicas, zoekt_enabled_namespaces, zoekt_nodes, "
            "project_statistics, projects, namespaces RESTART IDENTITY CASCADE"
        )
        with cursor.copy(
            "COPY namespaces (id, name, path, type, parent_id, traversal_ids, created_at, "
            "updated_at) FROM STDIN"
        ) as copy:
            for i in range(namespaces):
                root = GROUP_ID_BASE + i
                copy.write_row((root, f"g{i}", f"g{i}", "Group", None, [root], STAMP, STAMP))
            pnid = PROJECT_NAMESPACE_ID_BASE
            for i, count in enumerate(counts):
                root = GROUP_ID_BASE + i
                for _ in range(count):
                    pnid += 1
                    copy.write_row(
                        (pnid, f"p{pnid}", f"p{pnid}", "Project", root, [root, pnid], STAMP, STAMP)
                    )
        with cursor.copy(
            "COPY projects (id, name, path, namespace_id, project_namespace_id, created_at, "
            "updated_at) FROM STDIN"
        ) as copy:
            pnid = PROJECT_NAMESPACE_ID_BASE
            project_id = 0
            for i, count in enumerate(counts):
                for _ in range(count):
                    pnid += 1
                    project_id += 1
                    copy.write_row(
                        (project_id, f"p{pnid}", f"p{pnid}", GROUP_ID_BASE + i, pnid, STAMP, STAMP)
                    )
        with cursor.copy(
            "COPY project_statistics (project_id, namespace_id, repository_size, updated_at) "
            "FROM STDIN"
        ) as copy:
            project_id = 0
            for i, count in enumerate(counts):
                for _ in range(count):
                    project_id += 1
                    if rng.random() < 0.05:
                        without_statistics += 1
                        continue
                    size = int(rng.lognormvariate(17, 1.6))
                    demand += 3 * size
                    copy.write_row((project_id, GROUP_ID_BASE + i, size, STAMP))
        with cursor.copy(
            "COPY zoekt_enabled_namespaces (id, root_namespace_id, created_at, updated_at) "
            "FROM STDIN"
        ) as copy:
            for i in range(namespaces):
                copy.write_row((i + 1, GROUP_ID_BASE + i, STAMP, STAMP))
        mean = demand / FILL / nodes
        with cursor.copy(
            "COPY zoekt_nodes (uuid, index_base_url, search_base_url, metadata, total_bytes, "
            "usable_storage_bytes, last_seen_at, created_at, updated_at) FROM STDIN"
        ) as copy:
            for i in range(nodes):
                size = int(mean * rng.uniform(0.5, 1.5))
                metadata = {
                    "name": f"zoekt-{i}",
                    "process_health": {
                        "webserver": {"rss_bytes": (4 + i % 32) * 1024**3, "shards_loaded": i}
                    },
                }
                copy.write_row(
                    (
                        str(uuid.UUID(int=rng.getrandbits(128))),
                        f"http://zoekt-{i}:6065",
                        f"http://zoekt-{i}:6070",
                        json.dumps(metadata),
                        size,
                        size,
                        STAMP,
                        STAMP,
                        STAMP,
                    )
                )
        after_copy(
            url,
            cursor,
            (
                "namespaces",
                "projects",
                "project_statistics",
                "zoekt_enabled_namespaces",
                "zoekt_nodes",
            ),
        )
    return {
        "namespaces": namespaces,
        "projects": projects,
        "projects_without_statistics": without_statistics,
        "largest_namespace": max(counts),
        "nodes": nodes,
    }


# ----------------------------------------------------------------------------
# End to end
# ----------------------------------------------------------------------------


PHASES = ("lock", "cleanup", "select", "load", "plan", "log", "apply", "reselect")


def rollout_once(namespaces: int) -> dict:
    """One real rollout batch over every namespace; seconds and statements per phase."""
    from django.core.cache import cache
    from django.db import connection

    from planner.rollout import RolloutService
    from zoekt import app_settings, buffer_factor
    from zoekt.locks import LockKey, try_advisory_lock
    from zoekt.models import Index, Node, Replica

    app_settings.invalidate()
    cache.delete(buffer_factor.CACHE_KEY)
    # Steady state: the settings and the buffer factor are cached (the hourly
    # refresh-buffer-factor job keeps the factor warm); a cold cache adds one
    # settings read and the factor's two queries.
    app_settings.current()
    factor = buffer_factor.global_buffer_factor()
    Node.objects.update(last_seen_at=_now())  # online for the next 30 s
    connection.close()

    service = RolloutService()
    statements: collections.Counter[str] = collections.Counter()

    def count(execute, sql, params, many, context):
        statements[service.phase] += 1
        return execute(sql, params, many, context)

    # As the rollout job runs it: one transaction under the ROLLOUT advisory lock.
    started = time.perf_counter()
    with connection.execute_wrapper(count), try_advisory_lock(LockKey.ROLLOUT) as acquired:
        assert acquired, "another rollout holds the lock"
        result = service.execute(dry_run=False, batch_size=namespaces)
    total = time.perf_counter() - started
    statements["lock"] += statements.pop("idle", 0)
    plan = result.plan
    return {
        "outcome": str(result.outcome),
        "buffer_factor": factor,
        "seconds": {phase: result.seconds.get(phase, 0.0) for phase in PHASES},
        "total_seconds": total,
        "statements": {phase: statements.get(phase, 0) for phase in PHASES},
        "total_statements": sum(statements.values()),
        "project_rows": result.projects_loaded,
        "project_fetches": result.project_fetches,
        "planned": {
            "create": len(plan.create),
            "failures": len(plan.failures),
            "indices": sum(len(node.indices) for node in plan.nodes),
        },
        "written": {
            "replicas": Replica.objects.count(),
            "indices": Index.objects.count(),
            "errors": len(result.changes.errors),
        },
    }


def _now():
    from zoekt import clock

    return clock.now()


# ----------------------------------------------------------------------------
# The pure planner
# ----------------------------------------------------------------------------


def pure_plan(projects: int, runs: int) -> dict:
    from bench.planner_core import best_of_each, synthetic_scenario
    from planner.core import plan
    from planner.scenario import parse_scenario

    data = synthetic_scenario(projects)
    started = time.perf_counter()
    scenario = parse_scenario(data)
    parse_seconds = time.perf_counter() - started
    (bare, result), (recorded, _) = best_of_each(
        runs, lambda: plan(scenario, record_decisions=False), lambda: plan(scenario)
    )
    return {
        "projects": projects,
        "namespaces": len(scenario.namespaces),
        "nodes": len(scenario.nodes),
        "parse_seconds": parse_seconds,
        "plan_seconds": bare,
        "plan_seconds_with_decisions": recorded,
        "indices": sum(len(node.indices) for node in result.nodes),
        "failures": len(result.failures),
    }


# ----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespaces", type=int, default=2_000)
    parser.add_argument(
        "--project-counts", type=int, nargs="*", default=[20_000, 200_000], metavar="N"
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument(
        "--pure", type=int, nargs="*", default=[100_000, 1_000_000], metavar="N",
        help="project counts for the pure planner (none to skip)",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    url, _ = setup_django("bench", log_level="INFO")
    # The plan record is rendered (its cost is in the "log" phase) but not shown.
    devnull = open(os.devnull, "w")  # noqa: SIM115
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(devnull)

    results: dict = {"end_to_end": [], "pure": []}
    for projects in args.project_counts:
        print(f"seeding {args.namespaces:,} namespaces, {projects:,} projects", file=sys.stderr)
        started = time.perf_counter()
        seeded = seed(url, namespaces=args.namespaces, projects=projects, nodes=args.nodes)
        seeded["seed_seconds"] = time.perf_counter() - started
        print(f"rollout over {projects:,} projects", file=sys.stderr)
        results["end_to_end"].append({"seeded": seeded, **rollout_once(args.namespaces)})
    for projects in args.pure:
        print(f"pure plan of {projects:,} projects", file=sys.stderr)
        results["pure"].append(pure_plan(projects, args.runs))

    print_tables(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    with contextlib.suppress(Exception):
        devnull.close()
    return 0


def print_tables(results: dict) -> None:
    if results["end_to_end"]:
        print("\n### Rollout end to end (one batch over every namespace)\n")
        print(
            "| namespaces | projects | nodes | phase | seconds | SQL statements |\n"
            "|---:|---:|---:|---|---:|---:|"
        )
        for run in results["end_to_end"]:
            s = run["seeded"]
            for phase in PHASES:
                extra = ""
                if phase == "load":
                    extra = f" (+{run['project_fetches']} FETCH)"
                print(
                    f"| {s['namespaces']:,} | {s['projects']:,} | {s['nodes']} | {phase} "
                    f"| {run['seconds'][phase]:.3f} | {run['statements'][phase]}{extra} |"
                )
            print(
                f"| {s['namespaces']:,} | {s['projects']:,} | {s['nodes']} | **total** "
                f"| **{run['total_seconds']:.3f}** | **{run['total_statements']}** |"
            )
        print(
            "\n| projects | largest namespace | without statistics | outcome | planned creates "
            "| plan failures | indices | replicas written | apply errors |\n"
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|"
        )
        for run in results["end_to_end"]:
            s, p, w = run["seeded"], run["planned"], run["written"]
            print(
                f"| {s['projects']:,} | {s['largest_namespace']:,} "
                f"| {s['projects_without_statistics']:,} | {run['outcome']} | {p['create']:,} "
                f"| {p['failures']:,} | {w['indices']:,} | {w['replicas']:,} | {w['errors']} |"
            )
    if results["pure"]:
        print("\n### Pure planner (no database)\n")
        print(
            "| projects | namespaces | nodes | parse s | plan s | plan s with decisions "
            "| parse + plan s | indices | failures |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        )
        for r in results["pure"]:
            print(
                f"| {r['projects']:,} | {r['namespaces']:,} | {r['nodes']} "
                f"| {r['parse_seconds']:.2f} | {r['plan_seconds']:.3f} "
                f"| {r['plan_seconds_with_decisions']:.3f} "
                f"| {r['parse_seconds'] + r['plan_seconds']:.2f} | {r['indices']:,} "
                f"| {r['failures']:,} |"
            )


if __name__ == "__main__":
    sys.exit(main())
