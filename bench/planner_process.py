"""The planner as a process: start, read, parse, plan, write, for 400,000 projects on 200 nodes.

Run it alone (no database, no services; it uses both cores in turn)::

    python bench/planner_process.py [--projects 400000] [--runs 5] [--baseline REV]

It writes ``bench/planner_core.py``'s seeded synthetic scenario (named
nodes, as the loader writes them) to a temporary file and times
``python -m planner plan --input scenario.json --output plan.json`` as a
whole process, wall clock, best of ``--runs``. The same is timed, in turns
with it, for the planner at ``--baseline`` (a git revision checked out in a
temporary worktree; by default the last revision before the planner's JSON
edges were made fast), fed the same scenario without the fields that
revision does not know. Then, in this process, the phases of the current
planner: read the file, decode the JSON, build the scenario, plan, write
the plan.

The figures go to docs/benchmarks.md ("The planner as a process").
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.planner_core import synthetic_scenario  # noqa: E402
from planner.core import plan  # noqa: E402
from planner.scenario import load_json, parse_scenario  # noqa: E402

#: The planner before this benchmark's changes (JSON through the standard
#: library, dataclass projects, GitLab's older planning rules).
DEFAULT_BASELINE = "7d2a48e"


def _named(data: dict) -> dict:
    data = copy.deepcopy(data)
    for node in data["nodes"]:
        node["name"] = f"zoekt-{node['id']}"
    return data


def _stripped(data: dict) -> dict:
    """The scenario as an older planner reads it: no names, no existing node ids."""
    data = copy.deepcopy(data)
    for node in data["nodes"]:
        node.pop("name", None)
    for ns in data["namespaces"]:
        ns.pop("existing_node_ids", None)
    return data


def _process(python: str, cwd: Path, scenario: Path, output: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [python, "-m", "planner", "plan", "--input", str(scenario), "--output", str(output)],
        cwd=cwd,
        check=True,
    )
    return time.perf_counter() - started


def _phases(path: Path) -> dict[str, float]:
    """The phases of one plan in this process, with the collector off as the command has it."""
    gc.disable()
    out: dict[str, float] = {}
    started = time.perf_counter()
    raw = path.read_bytes()
    out["read"] = time.perf_counter() - started
    mark = time.perf_counter()
    data = load_json(raw)
    out["decode JSON"] = time.perf_counter() - mark
    mark = time.perf_counter()
    scenario = parse_scenario(data)
    out["build scenario"] = time.perf_counter() - mark
    mark = time.perf_counter()
    result = plan(scenario, record_decisions=False)
    out["plan"] = time.perf_counter() - mark
    mark = time.perf_counter()
    with tempfile.NamedTemporaryFile(suffix=".json") as target:
        Path(target.name).write_bytes(result.to_json_bytes() + b"\n")
    out["write plan"] = time.perf_counter() - mark
    del data, scenario, result
    gc.enable()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--projects", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="a git revision, or 'none'")
    args = parser.parse_args()

    data = _named(synthetic_scenario(args.projects))
    namespaces = len(data["namespaces"])
    nodes = len(data["nodes"])
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        current = tmp_path / "scenario.json"
        current.write_text(json.dumps(data))
        old = tmp_path / "scenario-baseline.json"
        old.write_text(json.dumps(_stripped(data)))
        worktree = None
        if args.baseline != "none":
            worktree = tmp_path / "baseline"
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(worktree), args.baseline],
                cwd=ROOT,
                check=True,
            )
        try:
            best = {"current": float("inf"), "baseline": float("inf")}
            for run in range(args.runs):
                seconds = _process(python, ROOT, current, tmp_path / "plan.json")
                best["current"] = min(best["current"], seconds)
                line = f"run {run + 1}/{args.runs}: current {seconds:.2f} s"
                if worktree is not None:
                    seconds = _process(python, worktree, old, tmp_path / "plan-baseline.json")
                    best["baseline"] = min(best["baseline"], seconds)
                    line += f", baseline {seconds:.2f} s"
                print(line, file=sys.stderr, flush=True)
        finally:
            if worktree is not None:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=True
                )
        phases = [_phases(current) for _ in range(3)]

    size_mib = len(json.dumps(data)) / 2**20
    print(
        f"\n{args.projects:,} projects in {namespaces:,} namespaces on {nodes} nodes "
        f"({size_mib:.0f} MiB of scenario JSON); best of {args.runs}, wall clock\n"
    )
    print("| planner | whole process |")
    print("|---|---:|")
    print(f"| current | {best['current']:.2f} s |")
    if worktree is not None:
        print(f"| baseline `{args.baseline}` | {best['baseline']:.2f} s |")
        print(f"| baseline / current | {best['baseline'] / best['current']:.2f}× |")
    print("\n| phase (in process, best of 3) | seconds |")
    print("|---|---:|")
    for phase in phases[0]:
        print(f"| {phase} | {min(p[phase] for p in phases):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
