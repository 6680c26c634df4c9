"""Hand-out benchmark: what one heartbeat's task hand-out costs as a node's backlog grows.

Run it with PostgreSQL and Redis available::

    python -m config.devservers exec -- .venv/bin/python bench/handout.py

In a scratch database ``<DATABASE_URL name>_handout_bench`` (dropped and created
again, migrated) it seeds with COPY ``--nodes`` nodes (4) and ``--namespaces``
root groups (2,000) holding ``--projects`` projects (80,000; heavy-tailed
namespace sizes, log-normal repository sizes), each project with a repository in
one index of its namespace. Then it queues index tasks for the first node's
repositories, in random order, through the product's task creation (so each task
gets its place in the admission queue), until the node's backlog reaches each of
``--backlogs`` (100, 1,000, 5,000, 20,000) in turn. At each backlog it times the
two hand-outs side by side, alternating A-G-G-A over ``--rounds`` rounds (4) of
``--calls`` calls (50):

  admission  ``protocol.hand_out_admitted``: 8 slots, a disk with room for all
  gitlab     ``protocol.hand_out_tasks``: a limit of 8 (GitLab's oldest first)

Each call runs in a transaction that is rolled back, so every call sees the same
backlog. It also reports what queueing cost, per 1,000 tasks. Results print as a
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

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.dashboard import seed  # noqa: E402
from bench.scratch import setup_django  # noqa: E402

SEED = 20261206
GIB = 1024**3
SLOTS = 8


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
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--namespaces", type=int, default=2000)
    parser.add_argument("--projects", type=int, default=80_000)
    parser.add_argument("--backlogs", default="100,1000,5000,20000")
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
    modes = {
        "admission": lambda: protocol.hand_out_admitted(
            node_id, room, only_delete=False, temporary_space_factor=1.0
        ),
        "gitlab": lambda: protocol.hand_out_tasks(node_id, SLOTS, only_delete=False),
    }
    results = {"config": vars(args) | {"json": None}, "seeded": seeded, "backlogs": []}
    queued = 0
    for backlog in backlogs:
        batch = repository_ids[queued:backlog]
        start = time.perf_counter()
        for first in range(0, len(batch), 500):
            create_bulk_tasks(Repository.objects.filter(id__in=batch[first : first + 500]))
        queue_seconds = time.perf_counter() - start
        queued = backlog
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE zoekt_tasks")
        namespaces = Task.objects.filter(state=0).values("namespace_id").distinct().count()
        took: dict[str, list[float]] = {mode: [] for mode in modes}
        for _round in range(args.rounds):
            for mode in ("admission", "gitlab", "gitlab", "admission"):
                took[mode] += time_calls(modes[mode], args.calls // 2)
        row = {
            "backlog": backlog,
            "namespaces": namespaces,
            "queue_ms_per_1000": 1000 * queue_seconds / max(1, len(batch)) * 1000,
        }
        for mode, values in took.items():
            row[mode] = {
                "median_ms": statistics.median(values),
                "p95_ms": percentile(values, 0.95),
                "calls": len(values),
            }
        results["backlogs"].append(row)
        print(
            f"backlog {backlog:>6}: admission {row['admission']['median_ms']:.2f} ms, "
            f"gitlab {row['gitlab']['median_ms']:.2f} ms",
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
        "| backlog (tasks) | namespaces | admission median (p95) | GitLab's median (p95) "
        "| admission ÷ GitLab's | admission ÷ its own at the smallest backlog "
        "| queueing, per 1,000 tasks |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        a, g = row["admission"], row["gitlab"]
        print(
            f"| {row['backlog']:,} | {row['namespaces']:,} "
            f"| {a['median_ms']:.2f} ms ({a['p95_ms']:.2f}) "
            f"| {g['median_ms']:.2f} ms ({g['p95_ms']:.2f}) "
            f"| {a['median_ms'] / g['median_ms']:.2f}× "
            f"| {a['median_ms'] / first['admission']['median_ms']:.2f}× "
            f"| {row['queue_ms_per_1000']:.0f} ms |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
