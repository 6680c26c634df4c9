"""The planner core against a baseline revision, side by side.

    python bench/planner_ab.py [--baseline REV] [--projects 100000 1000000] [--turns 5] [--runs 5]

Checks the baseline out into a temporary worktree, then for each size and
each case (disk only or memory on; with or without the decision records)
plans ``bench/planner_core.py``'s seeded synthetic scenario in separate
interpreters, the baseline and the current tree taking turns: each turn one
interpreter per side parses the scenario once and plans it ``--runs``
times. The table gives the best plan time of each side over every turn and
their ratio. Taking turns, a change in the machine's load hits both alike;
the best of many runs is what the code costs when nothing interferes.
No database and no services: only the planner core is timed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The commit before the planner core was split into its parts (packing, memory).
DEFAULT_BASELINE = "0333e08"

#: Run in the child interpreter: plan one scenario ``runs`` times with the planner at ``root``.
CHILD = """
import sys, time
root, projects, memory, record, runs = sys.argv[1:6]
sys.path.insert(0, root)
from bench.planner_core import synthetic_scenario, with_memory_budget
from planner.core import plan
from planner.scenario import parse_scenario
data = synthetic_scenario(int(projects))
if memory == "1":
    data = with_memory_budget(data)
scenario = parse_scenario(data)
best = float("inf")
for _ in range(int(runs)):
    start = time.perf_counter()
    plan(scenario, record_decisions=record == "1")
    best = min(best, time.perf_counter() - start)
print(best)
"""


def _time(root: Path, projects: int, memory: bool, record: bool, runs: int) -> float:
    args = [str(root), str(projects), str(int(memory)), str(int(record)), str(runs)]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        cwd=tempfile.gettempdir(),
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="a git revision")
    parser.add_argument("--projects", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--turns", type=int, default=5, help="interpreters per side and case")
    parser.add_argument("--runs", type=int, default=5, help="plans per interpreter")
    args = parser.parse_args()

    cases = [
        (projects, memory, record)
        for projects in args.projects
        for memory in (False, True)
        for record in (True, False)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(worktree), args.baseline],
            cwd=ROOT,
            check=True,
        )
        try:
            rows = []
            for number, (projects, memory, record) in enumerate(cases, 1):
                best = {"baseline": float("inf"), "current": float("inf")}
                for turn in range(args.turns):
                    for side, root in (("baseline", worktree), ("current", ROOT)):
                        seconds = _time(root, projects, memory, record, args.runs)
                        best[side] = min(best[side], seconds)
                    print(
                        f"case {number}/{len(cases)}, turn {turn + 1}/{args.turns}: "
                        f"baseline {best['baseline']:.4f} s, current {best['current']:.4f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                rows.append((projects, memory, record, best["baseline"], best["current"]))
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=True
            )

    print(f"| measure | baseline `{args.baseline}` | current | current / baseline |")
    print("|---|---:|---:|---:|")
    for projects, memory, record, old, new in rows:
        label = f"{projects:,} projects, {'memory on' if memory else 'disk'}, plan"
        if not record:
            label += ", no decision records"
        print(f"| {label} | {old:.4f} s | {new:.4f} s | {new / old:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
