"""AC10: nothing on the rollout path depends on the kind of deployment.

GitLab's planning chain — ``RolloutWorker`` → ``RolloutService`` →
``PlanningService`` — has no ``Gitlab::Saas.feature_available?`` call and
must keep none (the memory issue's acceptance criterion 10). Here the chain
is the Celery job ``zoekt.rollout`` (``planner.tasks.rollout_task``) →
``planner.rollout.RolloutService`` → selection, loader, the pure core and the
apply. This project does not model a deployment type at all; the nearest
things are two settings GitLab ties to one: ``zoekt_node_level_eviction_enabled``
(GitLab's SaaS-only eviction) and ``zoekt_auto_index_root_namespace``
(GitLab's self-managed-only enrolment).

Two guards, both regression tests rather than stubs:

* a static one: every project module the rollout job imports, transitively,
  is parsed, and no identifier or key-like string in its code names a
  deployment switch (prose in docstrings and help texts may mention SaaS);
* a dynamic one: the rollout, memory-aware, plans the same bytes under a
  "SaaS-like" and a "self-managed-like" configuration of those two settings.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import re
from pathlib import Path

import pytest
from django.db import transaction

from planner.rollout import PLAN_LOG_KEY
from planner.tasks import rollout_task
from tests.memory.helpers import GIB, enabled_group, node, records, set_setting

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("planner", "zoekt")
ENTRY = "planner.tasks"

#: What a deployment-type gate would be called: GitLab's ``Gitlab::Saas.feature_available?``
#: and ``Gitlab.com?``, or a switch of our own.
GATE = re.compile(
    r"saas|feature_available|gitlab_?com|is_com\b|deployment_?(type|kind|mode)|self[_-]?managed"
    r"|on_?prem",
    re.IGNORECASE,
)
#: Names that match but are not gates: the advisory-lock key of GitLab's
#: ``auto_index_self_managed`` scheduling task (it enrols namespaces; the memory
#: issue says it is not the planning path), defined with every other key.
NOT_GATES = {"SCHEDULING_AUTO_INDEX_SELF_MANAGED"}


def _module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # ``from a.b import NAME``: NAME is not a module
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    path = Path(spec.origin).resolve()
    return path if ROOT in path.parents else None


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for item in ast.walk(tree):
        if isinstance(item, ast.Import):
            found.update(alias.name for alias in item.names)
        elif isinstance(item, ast.ImportFrom):
            base = item.module or ""
            if item.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - item.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in item.names)
    return {name for name in found if name.split(".")[0] in PROJECT_PACKAGES}


def rollout_path_modules() -> dict[str, Path]:
    """Every project module ``planner.tasks`` imports, transitively (lazy imports included)."""
    seen: dict[str, Path] = {}
    todo = [ENTRY]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing a.b.c runs a/__init__ and a/b/__init__
            todo.append(".".join(parts[:i]))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        todo.extend(_imports(tree, name, path.name == "__init__.py"))
    return seen


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for item in ast.walk(tree):
        if isinstance(item, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = item.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def deployment_gates(source: str) -> list[str]:
    """Identifiers, and key-like strings (no spaces), in code that name a deployment switch."""
    tree = ast.parse(source)
    docstrings = _docstring_nodes(tree)
    hits = []
    for item in ast.walk(tree):
        names: list[str] = []
        if isinstance(item, ast.Name):
            names.append(item.id)
        elif isinstance(item, ast.Attribute):
            names.append(item.attr)
        elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(item.name)
        elif isinstance(item, ast.keyword) and item.arg:
            names.append(item.arg)
        elif isinstance(item, ast.alias):
            names.append(item.asname or item.name)
        elif (
            isinstance(item, ast.Constant)
            and isinstance(item.value, str)
            and id(item) not in docstrings
            and not re.search(r"\s", item.value)
        ):
            names.append(item.value)
        hits.extend(
            f"line {item.lineno}: {name}"
            for name in names
            if GATE.search(name) and name not in NOT_GATES
        )
    return hits


def test_the_walk_covers_the_whole_rollout_chain():
    modules = rollout_path_modules()
    for name in (
        "planner.tasks",
        "planner.rollout",
        "planner.selection",
        "planner.loader",
        "planner.core",
        "planner.scenario",
        "planner.plan",
        "planner.apply",
        "zoekt.memory",
        "zoekt.app_settings",
        "zoekt.models",
    ):
        assert name in modules, name


@pytest.mark.parametrize(
    "snippet",
    [
        "if Gitlab.Saas.feature_available('exact_code_search'):\n    pass",
        "if saas_feature_available(flag):\n    pass",
        "if settings.DEPLOYMENT_TYPE == 'x':\n    pass",
        "if app.get('deployment') == 'self-managed':\n    pass",
        "def plan(*, gitlab_com=False):\n    return gitlab_com",
        "mode = os.environ['ZOEKT_SAAS']",
    ],
)
def test_the_guard_catches_a_deployment_gate(snippet):
    assert deployment_gates(snippet)


def test_prose_about_saas_is_not_a_gate():
    source = (
        '"""GitLab\'s SaaS-only eviction."""\nx = f(help_text="SaaS-only node-level eviction")\n'
    )
    assert deployment_gates(source) == []


def test_ac10_no_deployment_gate_anywhere_on_the_rollout_path():
    found = {
        name: hits
        for name, path in sorted(rollout_path_modules().items())
        if (hits := deployment_gates(path.read_text(encoding="utf-8")))
    }
    assert found == {}


@pytest.mark.django_db
def test_ac10_the_rollout_plans_the_same_under_either_kind_of_deployment(now, caplog):
    caplog.set_level(logging.INFO)
    node(100 * GIB, "a")
    node(100 * GIB - 1, "b")
    enabled_group(*[1_000] * 4)
    plans = {}
    for kind, eviction, auto_index in (("saas-like", True, False), ("self-managed", False, True)):
        with transaction.atomic():  # each kind plans from the same state
            set_setting(
                zoekt_indexing_enabled=True,
                zoekt_node_memory_budget_bytes=4_000,
                zoekt_node_level_eviction_enabled=eviction,
                zoekt_auto_index_root_namespace=auto_index,
            )
            caplog.clear()
            summary = rollout_task()  # the RolloutWorker: job → service → planner → apply
            assert summary["outcome"] == "success", summary
            (record,) = records(caplog, PLAN_LOG_KEY)
            plans[kind] = record[PLAN_LOG_KEY]
            transaction.set_rollback(True)
    assert json.dumps(plans["saas-like"], sort_keys=True) == json.dumps(
        plans["self-managed"], sort_keys=True
    )
    assert "bounds" in plans["self-managed"]  # memory-aware on self-managed too
