"""The layout's arrows hold: no forbidden import and no import cycle (tests.layering).

The first tests read the real source. The rest feed the checker synthetic
trees and edges, so a forbidden import or a cycle is seen to fail it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.layering import PACKAGES, Import, cycles, forbidden_arrow, import_graph, violations

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT)


def test_the_source_has_no_forbidden_import_and_no_cycle(graph):
    assert violations(graph) == []


def test_the_checker_reads_every_package_of_the_layout(graph):
    packages = {module.partition(".")[0] for module in graph}
    assert packages == set(PACKAGES)
    assert "zoekt.actions" in graph
    assert "dashboard.readmodels" in graph
    assert "gitlab_sync.sweep" in graph
    assert {"config.settings", "config.celery", "config.urls", "config.wsgi"} <= set(graph)


def test_the_wiring_lives_outside_the_domain_and_nothing_imports_it(graph):
    wiring = {"settings", "celery", "urls", "wsgi", "devservers"}
    assert not {f"zoekt.{name}" for name in wiring} & set(graph)
    importers = {
        importer
        for importer, edges in graph.items()
        for edge in edges
        if edge.target.startswith("config") and not importer.startswith("config")
    }
    assert importers == set()


def test_the_wiring_arrows_are_the_only_ones_from_config_into_the_apps(graph):
    """The wiring's arrows, named: which app each wiring module reaches."""
    reached = {
        module: sorted({edge.target.partition(".")[0] for edge in graph[module]} - {"config"})
        for module in ("config.celery", "config.urls", "config.wsgi", "config.settings")
    }
    assert reached == {
        "config.celery": ["dashboard", "eviction", "gitlab_sync", "planner", "zoekt"],
        # The apps' URL modules are included by name (``include("api.urls")``), not imported.
        "config.urls": ["zoekt"],
        "config.wsgi": ["api"],
        "config.settings": ["zoekt"],
    }


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("zoekt.actions", "zoekt.tasks"),
        ("zoekt.models", "zoekt.app_settings"),
        ("zoekt.app_settings", "zoekt.querysets"),
        ("zoekt.models", "zoekt.querysets"),
        ("planner.records", "planner.rollout"),
    ],
    ids=lambda name: name,
)
def test_the_modules_that_imported_each_other_no_longer_do(graph, first, second):
    assert not any({first, second} <= set(component) for component in cycles(graph))


def test_the_plan_record_does_not_import_the_rollout_service(graph):
    assert "planner.rollout" not in {edge.target for edge in graph["planner.records"]}


def test_the_settings_accessor_does_not_import_the_models(graph):
    assert "zoekt.models" not in {edge.target for edge in graph["zoekt.app_settings"]}


def test_actions_import_no_task_module(graph):
    for module in ("zoekt.actions", "zoekt.operator_actions"):
        targets = {edge.target for edge in graph[module]}
        assert not {"zoekt.tasks", "zoekt.scheduling.tasks"} & targets, module


# --- the checker itself ---------------------------------------------------------------------


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


#: One module per package that imports nothing (``leaf``), and arrows the rules allow.
LEGAL_TREE = {
    **{f"{package}/__init__.py": "" for package in PACKAGES},
    **{f"{package}/leaf.py": "" for package in PACKAGES},
    "zoekt/models.py": "from zoekt import leaf\n",
    "config/urls.py": "from dashboard import views\nimport api.leaf\n",
    "planner/core.py": "from zoekt.models import Node\n",
    "eviction/policy.py": "from planner import core\nfrom zoekt import models\n",
    "api/views.py": "from zoekt.models import Node\n",
    "dashboard/views.py": "from eviction import policy\nfrom planner.core import plan\n",
    "dashboard/api.py": "import api.leaf\n",
    "config/celery.py": "from eviction import leaf\nfrom gitlab_sync import leaf as sync\n",
    "simulator/drive.py": "from dashboard import views\nfrom zoekt import models\n",
}


def test_a_tree_that_keeps_the_arrows_passes(tmp_path):
    assert violations(import_graph(write_tree(tmp_path, LEGAL_TREE))) == []


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "zoekt/models.py",
            "from planner import leaf\n",
            "zoekt.models (line 1) imports planner.leaf: zoekt may not import planner",
        ),
        (
            "zoekt/models.py",
            "def plan():\n    from planner.leaf import plan\n",
            "zoekt.models (line 2) imports planner.leaf: zoekt may not import planner",
        ),
        (
            "zoekt/models.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dashboard.leaf\n",
            "zoekt.models (line 3) imports dashboard.leaf: zoekt may not import dashboard",
        ),
        (
            "zoekt/models.py",
            "import eviction.leaf\n",
            "zoekt.models (line 1) imports eviction.leaf: zoekt may not import eviction",
        ),
        (
            "api/views.py",
            "from planner.leaf import plan\n",
            "api.views (line 1) imports planner.leaf: api may not import planner",
        ),
        (
            "planner/core.py",
            "from eviction import leaf\n",
            "planner.core (line 1) imports eviction.leaf: planner may not import eviction",
        ),
        (
            "planner/core.py",
            "from dashboard import leaf\n",
            "planner.core (line 1) imports dashboard.leaf: planner may not import dashboard",
        ),
        (
            "dashboard/views.py",
            "from simulator import leaf\n",
            "dashboard.views (line 1) imports simulator.leaf: dashboard may not import simulator",
        ),
        (
            "config/urls.py",
            "from simulator import leaf\n",
            "config.urls (line 1) imports simulator.leaf: config may not import simulator",
        ),
    ],
    ids=[
        "zoekt to planner",
        "zoekt to planner inside a function",
        "zoekt to dashboard under TYPE_CHECKING",
        "zoekt to eviction",
        "api to planner",
        "planner to eviction",
        "planner to dashboard",
        "the product to the simulator",
        "the wiring to the simulator",
    ],
)
def test_a_forbidden_import_fails_the_check(tmp_path, name, text, expected):
    tree = write_tree(tmp_path, {**LEGAL_TREE, name: text})

    assert violations(import_graph(tree)) == [expected]


def test_a_cycle_fails_the_check_however_lazy_its_imports(tmp_path):
    tree = write_tree(
        tmp_path,
        {
            **LEGAL_TREE,
            "zoekt/actions.py": "from zoekt import models\n",
            "zoekt/tasks.py": "def run():\n    from . import actions\n",
            "zoekt/models.py": "def fail():\n    from zoekt.tasks import run\n",
        },
    )

    assert violations(import_graph(tree)) == [
        "import cycle: zoekt.actions ↔ zoekt.models ↔ zoekt.tasks"
    ]


def test_a_forbidden_edge_injected_into_the_real_graph_fails_the_check(graph):
    injected = {module: set(edges) for module, edges in graph.items()}
    injected["zoekt.models"].add(Import("dashboard.readmodels", 1))

    found = violations(injected)

    assert found[0] == (
        "zoekt.models (line 1) imports dashboard.readmodels: zoekt may not import dashboard"
    )
    # The read models import the models, so the injected arrow closes a loop too.
    assert len(found) == 2
    assert found[1].startswith("import cycle: ")
    assert {"dashboard.readmodels", "zoekt.models"} <= set(found[1].split(": ")[1].split(" ↔ "))
    assert violations(graph) == []  # the real graph is untouched


def test_the_wiring_may_connect_the_apps_and_nothing_else_may():
    assert not forbidden_arrow("config.urls", "dashboard.urls")
    assert not forbidden_arrow("config.wsgi", "api.authentication")
    assert not forbidden_arrow("config.celery", "gitlab_sync.beat")
    assert forbidden_arrow("config.urls", "simulator.fakenode")
    assert forbidden_arrow("zoekt.views", "dashboard.urls")
    assert forbidden_arrow("zoekt.scheduling.handlers", "eviction.policy")
    assert forbidden_arrow("zoekt.models", "config.settings")
    assert forbidden_arrow("simulator.replay", "config.celery")
