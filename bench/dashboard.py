"""Dashboard benchmark: each page's server time and SQL statements on a large fleet.

Run it with PostgreSQL and Redis available::

    python -m config.devservers exec -- .venv/bin/python bench/dashboard.py

In a scratch database ``<DATABASE_URL name>_dashboard_bench`` (dropped and
created again, migrated) it seeds with COPY ``--nodes`` online search nodes
(200, each reporting webserver RSS, shards and a memory limit) and
``--namespaces`` enabled root groups (10,000) holding ``--projects``
projects (100,000; heavy-tailed sizes, log-normal repository sizes). All but
``--unplaced`` (2,000) of the namespaces have a ready replica (one in ten a
second one) of one to three ready indices with a ready repository per
project; the nodes have tasks in every state. Then it runs one dry rollout
over the unplaced namespaces with decision records (the largest plan row
the dashboard keeps) and ``KEEP - 1`` small ones, so the plans page lists a
full 50.

Each page is fetched ``--runs`` times (5) through Django's test ``Client``
in this process, logged in as a superuser: the time is the server's (no
network, no browser), the statements are counted with
``CaptureQueriesContext``. The first fetch warms the settings cache and is
not counted. Results print as a Markdown table (and JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.planner import namespace_sizes  # noqa: E402
from bench.scratch import after_copy, setup_django  # noqa: E402

SEED = 20260302
GIB = 1024**3
STAMP = "2026-01-01T00:00:00Z"
PROJECT_NAMESPACE_ID_BASE = 10_000_000
PROJECTS_PER_INDEX = 400


def seed(url: str, *, nodes: int, namespaces: int, projects: int, unplaced: int) -> dict:
    """COPY the fleet into the scratch database; returns what was seeded."""
    import psycopg

    rng = random.Random(SEED)
    counts = namespace_sizes(namespaces, projects, rng)
    sizes = [[int(rng.lognormvariate(16, 1.5)) for _ in range(count)] for count in counts]
    placed = namespaces - unplaced
    rows = {"replicas": 0, "indices": 0, "repositories": 0, "tasks": 0}
    node_used = [0] * nodes
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        with cursor.copy(
            "COPY namespaces (id, name, path, type, parent_id, traversal_ids, created_at, "
            "updated_at) FROM STDIN"
        ) as copy:
            for i in range(namespaces):
                root = i + 1
                copy.write_row((root, f"g{i}", f"g{i}", "Group", None, [root], STAMP, STAMP))
            pnid = PROJECT_NAMESPACE_ID_BASE
            for i, count in enumerate(counts):
                for _ in range(count):
                    pnid += 1
                    root = i + 1
                    copy.write_row(
                        (pnid, f"p{pnid}", f"p{pnid}", "Project", root, [root, pnid], STAMP, STAMP)
                    )
        with cursor.copy(
            "COPY projects (id, name, path, namespace_id, project_namespace_id, created_at, "
            "updated_at) FROM STDIN"
        ) as copy:
            pnid, project_id = PROJECT_NAMESPACE_ID_BASE, 0
            for i, count in enumerate(counts):
                for _ in range(count):
                    pnid += 1
                    project_id += 1
                    copy.write_row((project_id, f"p{pnid}", f"p{pnid}", i + 1, pnid, STAMP, STAMP))
        with cursor.copy(
            "COPY project_statistics (project_id, namespace_id, repository_size, updated_at) "
            "FROM STDIN"
        ) as copy:
            project_id = 0
            for i, namespace_sizes_ in enumerate(sizes):
                for size in namespace_sizes_:
                    project_id += 1
                    copy.write_row((project_id, i + 1, size, STAMP))
        with cursor.copy(
            "COPY zoekt_enabled_namespaces (id, root_namespace_id, number_of_replicas_override, "
            "created_at, updated_at) FROM STDIN"
        ) as copy:
            for i in range(namespaces):
                two = i < placed and i % 10 == 0  # one in ten placed namespaces wants two
                copy.write_row((i + 1, i + 1, 2 if two else None, STAMP, STAMP))

        # Replicas, indices and repositories of the placed namespaces.
        replicas, indices, repositories = [], [], []
        project_id = 0
        pnid = PROJECT_NAMESPACE_ID_BASE
        node_cursor = 0
        for i in range(namespaces):
            first_project, first_pnid = project_id, pnid
            project_id += counts[i]
            pnid += counts[i]
            if i >= placed:
                continue
            for _ in range(2 if i % 10 == 0 else 1):
                replica_id = len(replicas) + 1
                replicas.append((replica_id, i + 1, i + 1, 10))
                chunks = max(1, min(3, -(-counts[i] // PROJECTS_PER_INDEX)))
                per = -(-counts[i] // chunks)
                for c in range(chunks):
                    start, end = c * per, min(counts[i], (c + 1) * per)
                    if start >= end:
                        break
                    node = node_cursor % nodes
                    node_cursor += 1
                    used = max(3 * sum(sizes[i][start:end]), 1024)
                    node_used[node] += used
                    index_id = len(indices) + 1
                    metadata = {}
                    if c > 0:
                        metadata["project_namespace_id_from"] = first_pnid + start + 1
                    if end < counts[i]:
                        metadata["project_namespace_id_to"] = first_pnid + end
                    indices.append(
                        (index_id, i + 1, node + 1, replica_id, i + 1, 10, int(used / 0.6), used,
                         json.dumps(metadata))
                    )  # fmt: skip
                    for k in range(start, end):
                        pid = first_project + k + 1
                        repositories.append((index_id, pid, pid, 10, sizes[i][k] * 3))
        rows["replicas"], rows["indices"] = len(replicas), len(indices)
        rows["repositories"] = len(repositories)

        with cursor.copy(
            "COPY zoekt_nodes (id, uuid, index_base_url, search_base_url, metadata, total_bytes, "
            "used_bytes, indexed_bytes, usable_storage_bytes, last_seen_at, "
            "webserver_last_seen_at, created_at, updated_at) FROM STDIN"
        ) as copy:
            for n in range(nodes):
                total = max(node_used[n] * 3, 100 * GIB)
                used = node_used[n] + int(total * rng.uniform(0.05, 0.5))
                metadata = {
                    "name": f"zoekt-{n}",
                    "version": "1.16.2",
                    "process_health": {
                        "webserver": {
                            "rss_bytes": (4 + n % 28) * GIB,
                            "shards_loaded": 50 + n,
                            "memory_limit_bytes": 32 * GIB,
                            "restarts_15m": 0,
                        }
                    },
                }
                copy.write_row(
                    (
                        n + 1,
                        str(uuid.UUID(int=rng.getrandbits(128))),
                        f"http://zoekt-{n}:6065",
                        f"http://zoekt-{n}:6070",
                        json.dumps(metadata),
                        total,
                        used,
                        node_used[n],
                        total - used + node_used[n],
                        STAMP,
                        STAMP,
                        STAMP,
                        STAMP,
                    )
                )
        with cursor.copy(
            "COPY zoekt_replicas (id, zoekt_enabled_namespace_id, namespace_id, state, "
            "created_at, updated_at) FROM STDIN"
        ) as copy:
            for row in replicas:
                copy.write_row((*row, STAMP, STAMP))
        with cursor.copy(
            "COPY zoekt_indices (id, zoekt_enabled_namespace_id, zoekt_node_id, zoekt_replica_id, "
            "namespace_id, state, reserved_storage_bytes, used_storage_bytes, metadata, "
            "created_at, updated_at) FROM STDIN"
        ) as copy:
            for row in indices:
                copy.write_row((*row, STAMP, STAMP))
        with cursor.copy(
            "COPY zoekt_repositories (zoekt_index_id, project_id, project_identifier, state, "
            "size_bytes, created_at, updated_at) FROM STDIN"
        ) as copy:
            for row in repositories:
                copy.write_row((*row, STAMP, STAMP))
        with cursor.copy(
            "COPY zoekt_tasks (zoekt_node_id, zoekt_repository_id, project_identifier, task_type, "
            "state, perform_at, created_at, updated_at) FROM STDIN"
        ) as copy:
            states = (0, 0, 1, 10, 10, 10, 10, 250, 255)
            for t in range(len(repositories) // 5):
                copy.write_row(
                    (1 + t % nodes, t + 1, t + 1, 0, states[t % len(states)], STAMP, STAMP, STAMP)
                )
                rows["tasks"] += 1
        after_copy(
            url,
            cursor,
            (
                "namespaces",
                "projects",
                "project_statistics",
                "zoekt_enabled_namespaces",
                "zoekt_nodes",
                "zoekt_replicas",
                "zoekt_indices",
                "zoekt_repositories",
            ),
        )
    return {
        "nodes": nodes,
        "namespaces": namespaces,
        "unplaced": unplaced,
        "projects": projects,
        "largest_namespace": max(counts),
        "largest_namespace_id": counts.index(max(counts[:placed])) + 1,
        **rows,
    }


def rollout_plans(unplaced: int) -> dict:
    """One dry rollout over every unplaced namespace, then small ones until 50 are kept."""
    from planner import records
    from planner.models import RolloutPlan
    from planner.rollout import RolloutService
    from zoekt import clock
    from zoekt.models import Node

    Node.objects.update(last_seen_at=clock.now(), webserver_last_seen_at=clock.now())
    started = time.perf_counter()
    result = RolloutService(record_decisions=True).execute(dry_run=True, batch_size=unplaced)
    big_seconds = time.perf_counter() - started
    big = RolloutPlan.objects.order_by("-id").first()
    for _ in range(records.KEEP - 1):
        RolloutService(record_decisions=True).execute(dry_run=True, batch_size=32)
    return {
        "big_plan_id": big.id,
        "big_plan_namespaces": len(result.plan.namespaces_in_order),
        "big_plan_failures": len(result.plan.failures),
        "big_rollout_seconds": big_seconds,
        "big_log_phase_seconds": result.seconds.get("log", 0.0),
        "plans_kept": RolloutPlan.objects.count(),
    }


def time_pages(seeded: dict, plans: dict, runs: int) -> list[dict]:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from zoekt import clock
    from zoekt.models import Node

    user = User.objects.create_superuser("bench", password="bench-password-1")
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    middle = max(1, (seeded["namespaces"] // 50) // 2)
    pages = [
        ("fleet", reverse("dashboard-fleet")),
        ("plans", reverse("dashboard-plans")),
        (
            f"plan ({plans['big_plan_namespaces']:,} namespaces)",
            reverse("dashboard-plan", args=[plans["big_plan_id"]]),
        ),
        ("namespaces, page 1", reverse("dashboard-namespaces")),
        (f"namespaces, page {middle}", reverse("dashboard-namespaces") + f"?page={middle}"),
        ("namespaces, search", reverse("dashboard-namespaces") + "?q=g77"),
        (
            f"namespace ({seeded['largest_namespace']:,} projects)",
            reverse("dashboard-namespace", args=[seeded["largest_namespace_id"]]),
        ),
        ("/metrics", reverse("metrics")),
    ]
    results = []
    for label, url in pages:
        Node.objects.update(last_seen_at=clock.now(), webserver_last_seen_at=clock.now())
        assert client.get(url).status_code == 200, label  # warm the settings cache
        seconds = []
        for _ in range(runs):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get(url)
                seconds.append(time.perf_counter() - started)
            assert response.status_code == 200, label
        results.append(
            {
                "page": label,
                "url": url,
                "median_seconds": statistics.median(seconds),
                "best_seconds": min(seconds),
                "worst_seconds": max(seconds),
                "queries": len(captured),
                "bytes": len(response.content),
            }
        )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--namespaces", type=int, default=10_000)
    parser.add_argument("--projects", type=int, default=100_000)
    parser.add_argument("--unplaced", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    # Logs at WARNING: the plan records are not shown.
    url, _ = setup_django("dashboard_bench")
    from django.core.cache import cache

    cache.clear()
    print(
        f"seeding {args.nodes} nodes, {args.namespaces:,} namespaces, {args.projects:,} projects",
        file=sys.stderr,
    )
    started = time.perf_counter()
    seeded = seed(
        url,
        nodes=args.nodes,
        namespaces=args.namespaces,
        projects=args.projects,
        unplaced=args.unplaced,
    )
    seeded["seed_seconds"] = time.perf_counter() - started
    print("rollout plans", file=sys.stderr)
    plans = rollout_plans(args.unplaced)
    print("pages", file=sys.stderr)
    pages = time_pages(seeded, plans, args.runs)
    results = {"seeded": seeded, "plans": plans, "pages": pages}
    print_tables(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


def print_tables(results: dict) -> None:
    s, p = results["seeded"], results["plans"]
    print(
        f"\n{s['nodes']} nodes, {s['namespaces']:,} enabled namespaces ({s['unplaced']:,} "
        f"without replicas), {s['projects']:,} projects, {s['replicas']:,} replicas, "
        f"{s['indices']:,} indices, {s['repositories']:,} repositories, {s['tasks']:,} tasks; "
        f"{p['plans_kept']} plans kept, the largest over {p['big_plan_namespaces']:,} namespaces "
        f"({p['big_plan_failures']:,} failed; its dry rollout {p['big_rollout_seconds']:.2f} s, "
        f"of which {p['big_log_phase_seconds']:.2f} s logging and recording the plan)\n"
    )
    print(
        "| page | median s | best s | worst s | SQL statements | HTML bytes |\n"
        "|---|---:|---:|---:|---:|---:|"
    )
    for r in results["pages"]:
        print(
            f"| {r['page']} | {r['median_seconds']:.3f} | {r['best_seconds']:.3f} "
            f"| {r['worst_seconds']:.3f} | {r['queries']} | {r['bytes']:,} |"
        )


if __name__ == "__main__":
    sys.exit(main())
