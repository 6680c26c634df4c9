"""GitLab sweep benchmark: a full sweep of a fake GitLab of ``--projects`` projects.

    python -m config.devservers exec -- .venv/bin/python bench/gitlab_sync.py [--projects 100000]

The fake GitLab (``simulator.fakegitlab``) runs in a process of its own, serving over
loopback HTTP: ``--groups`` top-level groups of four subgroups each, ``--users``
personal namespaces, and the projects spread over them; it answers a 429 with
``Retry-After: 0`` every 500 requests and a 502 every 700, which python-gitlab retries.
This process runs ``gitlab_sync.sweep.run`` against a scratch database ``<name>_gitlab``
and reports the seconds, the requests made, the SQL statements (all of them, and per
page of 100 projects, beside a sweep of a tenth of the projects in the same run: they
must not grow with the projects) and the peak memory of this process. Then a delta
sweep (``kind="delta"``) over the same GitLab with 1 % of the projects renamed,
resized and active since: every group compared, the active projects written.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scratch import setup_django  # noqa: E402


def build_gitlab(projects: int, groups: int, users: int, changed: float = 0.0):
    from simulator.fakegitlab import FakeGitLab

    gitlab = FakeGitLab("bench-token", rate_limit_every=500, error_every=700, retry_after=0)
    homes = []
    gid = 10
    for r in range(groups):
        root = gitlab.add_group(gid, f"root-{r}")
        homes.append(root.id)
        gid += 1
        for s in range(4):
            gitlab.add_group(gid, f"sub-{r}-{s}", root.id if s < 3 else gid - 1)
            homes.append(gid)
            gid += 1
    for u in range(users):
        gitlab.add_user(5_000_000 + u, f"user-{u}")
        homes.append(5_000_000 + u)
    step = max(1, round(1 / changed)) if changed else 0
    for p in range(projects):
        size = (p % 97 + 1) * 1024 * 1024
        path = f"project-{p}"
        active = "2026-01-01T00:00:00+00:00"
        if step and p % step == 0:
            # Pushed to and renamed since the sweep: active, as GitLab would say.
            size, path, active = size + 4096, f"renamed-{p}", "2099-01-01T00:00:00+00:00"
        gitlab.add_project(
            10_000_000 + p,
            path,
            homes[p % len(homes)],
            repository_size=size,
            last_activity_at=active,
        )
    return gitlab


def _serve(projects, groups, users, changed, ready, stop) -> None:
    from simulator.fakegitlab import serve

    gitlab = build_gitlab(projects, groups, users, changed)
    with serve(gitlab) as url:
        ready.put(url)
        stop.wait()
        ready.put(dict(gitlab.requests))


def _every_hundredth():
    """The sweep's progress, a line in a hundred (one every 10,000 projects)."""
    seen = [0]

    def progress(line: str) -> None:
        seen[0] += 1
        if seen[0] % 100 == 0 or line.startswith("complete"):
            print(f"  {line}", file=sys.stderr, flush=True)

    return progress


def sweep_once(
    projects: int, groups: int, users: int, changed: float = 0.0, kind: str = "full"
) -> dict:
    from django.db import connection

    from gitlab_sync import sweep

    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(projects, groups, users, changed, ready, stop))
    server.start()
    try:
        url = ready.get(timeout=600)
        config = sweep.Config(url=url, token="bench-token", timeout=30)
        counted = [0]

        def count(execute, sql, params, many, context):
            counted[0] += 1
            return execute(sql, params, many, context)

        started = time.perf_counter()
        with connection.execute_wrapper(count):
            record = sweep.run(config, progress=_every_hundredth(), kind=kind)
        seconds = time.perf_counter() - started
        statements = counted[0]
        stop.set()
        served = ready.get(timeout=60)
    finally:
        stop.set()
        server.join(30)
    pages = -(-projects // 100)
    return {
        "kind": record.kind,
        "projects": projects,
        "written": record.counts["projects"],
        "seconds": seconds,
        "projects_per_second": projects / seconds,
        "requests": record.counts["requests"],
        "answers": record.counts["answers"],
        "served": served,
        "statements": statements,
        "statements_per_project_page": statements / pages,
        "counts": {k: v for k, v in record.counts.items() if k != "skipped_objects"},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--projects", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=2_000, help="top-level groups")
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    setup_django("gitlab")
    from gitlab_sync.models import Seen, Sweep
    from zoekt.models import Namespace, Project

    def clear() -> None:
        Project.objects.all().delete()
        Namespace.objects.all().delete()
        Sweep.objects.all().delete()
        Seen.objects.all().delete()

    small_projects = args.projects // 10
    print(f"sweep of {small_projects:,} projects (the per-page baseline)", file=sys.stderr)
    small = sweep_once(small_projects, args.groups // 10, args.users // 10)
    clear()
    print(f"sweep of {args.projects:,} projects", file=sys.stderr)
    full = sweep_once(args.projects, args.groups, args.users)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("delta sweep with 1 % of the projects changed", file=sys.stderr)
    delta = sweep_once(args.projects, args.groups, args.users, changed=0.01, kind="delta")
    results = {"small": small, "full": full, "delta_1pct": delta, "peak_rss_mib": peak_mib}

    print(
        "\n| sweep | projects in GitLab | written | seconds | requests | statements "
        "| per 100 projects in GitLab |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, r in (("full, a tenth", small), ("full", full), ("delta, 1 % changed", delta)):
        print(
            f"| {label} | {r['projects']:,} | {r['written']:,} | {r['seconds']:.1f} | "
            f"{r['requests']:,} | {r['statements']:,} | {r['statements_per_project_page']:.1f} |"
        )
    print(
        f"\nstatements per page of 100 projects: {small['statements_per_project_page']:.1f} at "
        f"{small['projects']:,} projects, {full['statements_per_project_page']:.1f} at "
        f"{full['projects']:,}; peak RSS of the sweeping process {peak_mib:,.0f} MiB; answers "
        f"retried: {json.dumps(full['answers'])}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
