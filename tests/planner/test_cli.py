"""``python -m planner``: run as operators run it, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.planner.builders import namespace, node, scenario

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def run(*args: str, stdin: str | bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    if isinstance(stdin, str):
        stdin = stdin.encode()
    return subprocess.run(
        [sys.executable, "-m", "planner", *args],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


GOOD = scenario(
    [node(1, 1000), node(2, 1000)],
    [namespace(10, 100, [(101, 1, 100), (102, 2, None)], replicas=2)],
    buffer_factor=3,
)


def test_plan_reads_stdin_and_writes_json_to_stdout():
    done = run("plan", stdin=json.dumps(GOOD))
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    result = json.loads(done.stdout)
    assert result["total_required_storage_bytes"] == 600
    assert [n["id"] for n in result["nodes"]] == [1, 2]


def test_plan_reads_and_writes_files(tmp_path):
    source = tmp_path / "scenario.json"
    target = tmp_path / "plan.json"
    source.write_text(json.dumps(GOOD))
    done = run("plan", "--input", str(source), "--output", str(target))
    assert done.returncode == 0, done.stderr
    assert done.stdout == b""
    assert json.loads(target.read_text())["create"][0]["namespace_id"] == 100


def test_plan_output_is_byte_for_byte_the_expected_file(tmp_path):
    target = tmp_path / "plan.json"
    done = run("plan", "--input", str(DATA / "rollover_scenario.json"), "--output", str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == (DATA / "rollover_plan.json").read_bytes()


def test_explain_says_why_each_earlier_candidate_was_passed_over():
    done = run("explain", "--input", str(DATA / "rollover_scenario.json"), "--namespace", "100")
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "replica 0 index 1: node 2" in text
    assert (
        "node 1 passed over: exhausted (already holds an index of this namespace); "
        "insufficient unclaimed storage (requested 50, available 10"
    ) in text


def _valid() -> dict:
    return scenario(
        [node(1, 1000), node(2, 500)],
        [
            namespace(
                10, 100, [(101, 1, 100), (102, 2, 200)], existing=[(5, "ready"), (6, "pending")]
            )
        ],
        buffer_factor=3,
        max_indices_per_replica=10,
    )


def _without_nodes(s):
    del s["nodes"]


def _set(path, value):
    def mutate(s):
        target = s
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _duplicate_node(s):
    s["nodes"][1]["id"] = 1


def _duplicate_project(s):
    s["namespaces"][0]["projects"][1]["project_namespace_id"] = 101


def _duplicate_enabled_namespace(s):
    s["namespaces"].append(namespace(10, 200, []))


BAD = [
    pytest.param(_without_nodes, "nodes", id="missing nodes"),
    pytest.param(_set(["nodes", 1, "id"], "2"), "nodes[1].id", id="node id not an integer"),
    pytest.param(_set(["nodes", 0, "id"], True), "nodes[0].id", id="node id a boolean"),
    pytest.param(
        _set(["nodes", 1, "unclaimed_storage_bytes"], 1.5),
        "nodes[1].unclaimed_storage_bytes",
        id="unclaimed bytes a float",
    ),
    pytest.param(
        _set(["namespaces", 0, "projects", 1, "repository_size"], "200"),
        "namespaces[0].projects[1].repository_size",
        id="repository_size a string",
    ),
    pytest.param(
        _set(["namespaces", 0, "projects", 0, "repository_size"], -1),
        "namespaces[0].projects[0].repository_size",
        id="repository_size negative",
    ),
    pytest.param(_duplicate_node, "nodes[1].id", id="duplicate node id"),
    pytest.param(
        _duplicate_project,
        "namespaces[0].projects[1].project_namespace_id",
        id="duplicate project namespace id",
    ),
    pytest.param(
        _duplicate_enabled_namespace,
        "namespaces[1].enabled_namespace_id",
        id="duplicate enabled namespace id",
    ),
    pytest.param(
        _set(["namespaces", 0, "existing_replicas", 1, "state"], "initializing"),
        "namespaces[0].existing_replicas[1].state",
        id="unknown replica state",
    ),
    pytest.param(
        _set(["namespaces", 0, "number_of_replicas"], -1),
        "namespaces[0].number_of_replicas",
        id="number_of_replicas -1",
    ),
    pytest.param(
        _set(["options", "buffer_factor"], 0), "options.buffer_factor", id="buffer_factor 0"
    ),
    pytest.param(
        _set(["options", "buffer_factor"], -2.5),
        "options.buffer_factor",
        id="buffer_factor negative",
    ),
    pytest.param(
        _set(["options", "max_indices_per_replica"], 0),
        "options.max_indices_per_replica",
        id="max_indices_per_replica 0",
    ),
    pytest.param(
        _set(["options", "memory"], {"memory_ratio": "half"}),
        "options.memory.memory_ratio",
        id="memory ratio not a number",
    ),
    pytest.param(
        _set(["nodes", 0, "unclaimed_storage_byte"], 5),
        "nodes[0].unclaimed_storage_byte",
        id="misspelt field",
    ),
    pytest.param(_set(["namespaces"], {}), "namespaces", id="namespaces not an array"),
]


@pytest.mark.parametrize(("mutate", "field"), BAD)
def test_invalid_scenario_exits_2_with_one_line_naming_the_field(mutate, field):
    bad = _valid()
    mutate(bad)
    done = run("plan", stdin=json.dumps(bad))
    assert done.returncode == 2
    assert done.stdout == b""
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"invalid scenario: {field}: "), lines[0]
    assert "Traceback" not in lines[0]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"nodes": [', id="truncated"),
        pytest.param("", id="empty input"),
        pytest.param('{"nodes": [], "namespaces": [],}', id="trailing comma"),
        pytest.param('{"nodes": [], "namespaces": []} {}', id="two documents"),
        pytest.param('{"nodes": [{"id": 1, "unclaimed_storage_bytes": NaN}]}', id="NaN"),
        pytest.param(b"\xff\xfe{", id="not UTF-8"),
        pytest.param("[]", id="not an object"),
    ],
)
def test_malformed_json_exits_2_with_one_line(text):
    done = run("plan", stdin=text)
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("invalid scenario: scenario: "), lines[0]


def test_negative_unclaimed_storage_is_accepted():
    ok = scenario([node(1, -5), node(2, 100)], [namespace(10, 100, [(101, 1, 10)])])
    done = run("plan", stdin=json.dumps(ok))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["nodes"][0]["id"] == 2


def test_a_missing_input_file_exits_2_naming_the_option(tmp_path):
    done = run("plan", "--input", str(tmp_path / "nope.json"))
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("invalid scenario: --input: cannot read")


def test_a_bad_invocation_is_one_line_too():
    done = run("plan", "--frobnicate")
    assert done.returncode == 2
    assert len(done.stderr.decode().splitlines()) == 1
    assert done.stdout == b""


def test_the_core_imports_no_django():
    code = (
        "import sys, planner.core, planner.explain, planner.filters, planner.__main__; "
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, cwd=ROOT, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout
