"""No function of the planner core or the eviction cores runs past 80 lines.

Each module is parsed with ``ast``; a function's (or method's) length is
counted from its ``def`` line to its last line, signature and docstring
included, decorators not. The test names every offender.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

MAX_LINES = 80

#: The planner's pure core, the desired balance and the eviction cores.
MODULES = (
    "planner/core.py",
    "planner/packing.py",
    "planner/memory.py",
    "planner/filters.py",
    "planner/plan.py",
    "planner/explain.py",
    "planner/scenario.py",
    "planner/balance.py",
    "eviction/policy.py",
    "eviction/actions.py",
)


def long_functions(source: str, path: str, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (N lines)`` for every function of ``source`` longer than ``limit``."""
    found = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append(f"{path}:{node.lineno} {node.name} ({length} lines)")
    return found


@pytest.mark.parametrize("path", MODULES)
def test_no_function_of_the_cores_is_longer_than_80_lines(path):
    offenders = long_functions((ROOT / path).read_text(), path)
    assert not offenders, "longer than 80 lines: " + "; ".join(offenders)


def test_the_check_names_a_long_function_and_its_length():
    body = "\n".join(f"        x = {i}" for i in range(80))
    source = f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{body}\n"
    assert long_functions(source, "m.py") == ["m.py:6 long (81 lines)"]
    assert long_functions(source, "m.py", limit=81) == []
