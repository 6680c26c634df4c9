"""The pure cores stay pure: importing one loads no Django, DRF or Celery module.

Each module is imported in a fresh interpreter (this process has Django loaded
already), and the test fails naming every framework module it pulled in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The planner core and its parts, the scenario contract, the desired balance, eviction's
#: policies, and the demo catalog's row builders (the placement bench plans them without
#: Django).
PURE_MODULES = (
    "planner.core",
    "planner.packing",
    "planner.memory",
    "planner.scenario",
    "planner.plan",
    "planner.filters",
    "planner.explain",
    "planner.balance",
    "planner.provisioning",
    "eviction.policy",
    "eviction.memory_policy",
    "zoekt.capacity",
    "zoekt.admission",
    "zoekt.catalog_rows",
)

#: The frameworks a pure module must not load (their top-level package names).
FRAMEWORKS = ("django", "rest_framework", "drf_spectacular", "celery", "kombu")


def framework_modules_loaded_by(module: str) -> list[str]:
    probe = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"frameworks = {FRAMEWORKS!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.partition('.')[0] in frameworks)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("module", PURE_MODULES)
def test_importing_a_pure_module_loads_no_framework(module):
    assert framework_modules_loaded_by(module) == []


def test_the_probe_sees_a_framework_when_one_is_loaded():
    # The Django edge of memory pressure loads Django through zoekt.memory.
    assert "django" in framework_modules_loaded_by("zoekt.memory")
