"""Hand-out benchmark: what one heartbeat's task hand-out costs as a node's backlog grows.

Run it with PostgreSQL and Redis available::

    python -m config.devservers exec -- .venv/bin/python bench/handout.py

In a scratch database ``<DATABASE_URL name>_handout_bench`` (dropped and created
again, migrated) it seeds with COPY ``--nodes`` nodes (8) and ``--namespaces``
root groups (4,000) holding ``--projects`` projects (160,000; heavy-tailed
namespace sizes, log-normal repository sizes), each project with a repository in
one index of its namespace. Then it queues index tasks for the first node's
repositories, in random order, through the product's task creation (so each task
gets its place in the admission queue), until the node's backlog reaches each of
``--backlogs`` (100, 1,000, 5,000, 15,000) in turn. At each backlog it times the
three hand-outs side by side, alternating A-R-G-G-R-A over ``--rounds`` rounds (4) of
``--calls`` calls (50):

  admission  ``protocol.hand_out_admitted``: 8 slots, a disk with room for all
  ranked     the same, with the query admission control used before tasks kept their
             place in the queue on their rows: it joined every due task of the node
             to its repository, index, the live moves and the project's statistics
             and ranked them all (``row_number()`` per priority and namespace)
  gitlab     ``protocol.hand_out_tasks``: a limit of 8 (GitLab's oldest first)

Each call runs in a transaction that is rolled back, so every call sees the same
backlog. It also reports what queueing cost, per 1,000 tasks, and how much of it
was placing the tasks in the admission queue (``queue_for_admission``). Results print as a
Markdown table (and JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.dashboard import seed  # noqa: E402
from bench.scratch import setup_django  # noqa: E402

SEED = 20261206
GIB = 1024**3
SLOTS = 8

# Admission control's query before 2026-12-06, giving the columns of today's
# (``protocol._ADMISSION_SQL``): the rank within the namespace stands for the turn. Built
# once Django is set up, from the expressions a task's place in its queue is computed from.
RANKED_SQL = """
SELECT t.id, t.zoekt_repository_id, t.project_identifier, t.task_type, t.state, t.perform_at,
       t.repository_state, t.project_id, t.index_bytes, t.priority, t.namespace_id, t.turn,
       b.backlog
FROM (
    SELECT count(*) AS backlog FROM (
        SELECT 1 FROM zoekt_tasks WHERE zoekt_node_id = %(node_id)s AND state = 0
        LIMIT %(backlog_cap)s
    ) pending
) b
LEFT JOIN LATERAL (
    SELECT ranked.*, row_number() OVER (
        PARTITION BY priority, namespace_id ORDER BY index_bytes DESC, perform_at, id
    ) AS turn
    FROM (
        SELECT t.id, t.zoekt_repository_id, t.project_identifier, t.task_type, t.state,
               t.perform_at, r.state AS repository_state, r.project_id,
               {index_bytes} AS index_bytes,
               {priority} AS priority,
               COALESCE(i.namespace_id, 0) AS namespace_id
        {queued_from}
        WHERE t.zoekt_node_id = %(node_id)s AND t.state IN (0, 1) AND t.perform_at <= %(now)s
          AND (NOT %(only_delete)s OR t.task_type = 50)
    ) ranked
    ORDER BY state <> 1, priority, turn, perform_at, id
    LIMIT %(window)s
) t ON true
"""


def ranked_sql() -> str:
    from zoekt.scheduling import task_creation

    return RANKED_SQL.format(
        index_bytes=task_creation.INDEX_BYTES_SQL,
        priority=task_creation.PRIORITY_SQL,
        queued_from=task_creation.QUEUED_FROM_SQL,
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_calls(call, calls: int) -> list[float]:
    from django.db import transaction

    took = []
    for _ in range(calls):
        with transaction.atomic():
            start = time.perf_counter()
            call()
            took.append((time.perf_counter() - start) * 1000)
            transaction.set_rollback(True)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--namespaces", type=int, default=4000)
    parser.add_argument("--projects", type=int, default=160_000)
    parser.add_argument("--backlogs", default="100,1000,5000,15000")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    backlogs = [int(b) for b in args.backlogs.split(",")]

    url, _name = setup_django("handout_bench")
    print("seeding…", file=sys.stderr)
    seeded = seed(
        url, nodes=args.nodes, namespaces=args.namespaces, projects=args.projects, unplaced=0
    )

    from django.db import connection

    from zoekt import admission, protocol
    from zoekt.models import Repository, Task
    from zoekt.scheduling import task_creation
    from zoekt.scheduling.task_creation import create_bulk_tasks

    Task.objects.all().delete()
    node_id = 1
    repository_ids = list(
        Repository.objects.filter(zoekt_index__zoekt_node_id=node_id).values_list("id", flat=True)
    )
    random.Random(SEED).shuffle(repository_ids)
    if len(repository_ids) < max(backlogs):
        parser.error(f"node {node_id} holds {len(repository_ids)} repositories: too few")
    room = admission.NodeRoom(SLOTS, 1000 * GIB, 100 * GIB, 0.60, 0.75)

    def admitted():
        return protocol.hand_out_admitted(
            node_id, room, only_delete=False, temporary_space_factor=1.0
        )

    former_sql = ranked_sql()

    def ranked():
        with mock.patch.object(protocol, "_ADMISSION_SQL", former_sql):
            return admitted()

    modes = {
        "admission": admitted,
        "ranked": ranked,
        "gitlab": lambda: protocol.hand_out_tasks(node_id, SLOTS, only_delete=False),
    }
    results = {"config": vars(args) | {"json": None}, "seeded": seeded, "backlogs": []}
    queued = 0
    for backlog in backlogs:
        batch = repository_ids[queued:backlog]
        placing = [0.0]

        def timed_placing(task_ids, _place=task_creation.queue_for_admission, _took=placing):
            start = time.perf_counter()
            _place(task_ids)
            _took[0] += time.perf_counter() - start

        start = time.perf_counter()
        with mock.patch.object(task_creation, "queue_for_admission", timed_placing):
            for first in range(0, len(batch), 500):
                create_bulk_tasks(Repository.objects.filter(id__in=batch[first : first + 500]))
        queue_seconds = time.perf_counter() - start
        queued = backlog
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE zoekt_tasks")
        namespaces = Task.objects.filter(state=0).values("namespace_id").distinct().count()
        took: dict[str, list[float]] = {mode: [] for mode in modes}
        for _round in range(args.rounds):
            for mode in ("admission", "ranked", "gitlab", "gitlab", "ranked", "admission"):
                took[mode] += time_calls(modes[mode], args.calls // 2)
        row = {
            "backlog": backlog,
            "namespaces": namespaces,
            "queue_ms_per_1000": 1000 * queue_seconds / max(1, len(batch)) * 1000,
            "placing_ms_per_1000": 1000 * placing[0] / max(1, len(batch)) * 1000,
        }
        for mode, values in took.items():
            row[mode] = {
                "median_ms": statistics.median(values),
                "p95_ms": percentile(values, 0.95),
                "calls": len(values),
            }
        results["backlogs"].append(row)
        print(
            f"backlog {backlog:>6}: "
            + ", ".join(f"{mode} {row[mode]['median_ms']:.2f} ms" for mode in modes),
            file=sys.stderr,
        )
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def print_table(results: dict) -> None:
    rows = results["backlogs"]
    first = rows[0]
    print(
        "| backlog (tasks) | namespaces | admission, median (p95) "
        "| ranking the backlog (before) | GitLab's | admission ÷ before | admission ÷ GitLab's "
        "| admission ÷ itself at the smallest backlog | queueing, per 1,000 tasks "
        "(of it, placing in the queue) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def cell(figures: dict) -> str:
        return f"{figures['median_ms']:.2f} ms ({figures['p95_ms']:.2f})"

    for row in rows:
        a, r, g = row["admission"], row["ranked"], row["gitlab"]
        print(
            f"| {row['backlog']:,} | {row['namespaces']:,} | {cell(a)} | {cell(r)} | {cell(g)} "
            f"| {a['median_ms'] / r['median_ms']:.2f}× "
            f"| {a['median_ms'] / g['median_ms']:.2f}× "
            f"| {a['median_ms'] / first['admission']['median_ms']:.2f}× "
            f"| {row['queue_ms_per_1000']:.0f} ms ({row['placing_ms_per_1000']:.0f} ms) |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
