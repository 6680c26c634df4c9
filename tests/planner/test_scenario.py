"""Parsing a scenario: defaults, normalisation, and every problem named by its field."""

from __future__ import annotations

import pytest

from planner.scenario import (
    MemoryOptions,
    Options,
    ProcessHealth,
    Scenario,
    ScenarioError,
    WebserverHealth,
    parse_scenario,
)


def minimal(**namespace_fields) -> dict:
    ns = {"enabled_namespace_id": 1, "namespace_id": 2, **namespace_fields}
    return {"nodes": [{"id": 1, "unclaimed_storage_bytes": 5}], "namespaces": [ns]}


def test_missing_optional_fields_take_the_contract_defaults():
    parsed = parse_scenario(minimal())
    assert parsed.options == Options(
        buffer_factor=3,
        max_indices_per_replica=10,
        memory=MemoryOptions(node_memory_budget_bytes=None, memory_ratio=0.5, concurrency_factor=4),
    )
    (ns,) = parsed.namespaces
    assert ns.number_of_replicas == 1
    assert ns.existing_replicas == ()
    assert ns.projects == ()
    assert parsed.nodes[0].memory_budget_bytes is None
    assert parsed.nodes[0].process_health is None


def test_null_options_are_defaults_too():
    data = minimal(number_of_replicas=None, existing_replicas=None, projects=None)
    data["options"] = {"buffer_factor": None, "max_indices_per_replica": None, "memory": None}
    parsed = parse_scenario(data)
    assert parsed.options == Options()
    assert parsed.namespaces[0].number_of_replicas == 1


def test_memory_options_and_node_memory_fields_are_kept():
    data = minimal()
    data["options"] = {
        "memory": {
            "node_memory_budget_bytes": 1 << 30,
            "memory_ratio": 0.25,
            "concurrency_factor": 2,
        }
    }
    data["nodes"][0]["memory_budget_bytes"] = 1 << 20
    data["nodes"][0]["process_health"] = {
        "webserver": {"rss_bytes": 123, "shards_loaded": 4},
        "indexer": {"rss_bytes": 9},
    }
    parsed = parse_scenario(data)
    assert parsed.options.memory == MemoryOptions(1 << 30, 0.25, 2)
    assert parsed.nodes[0].memory_budget_bytes == 1 << 20
    assert parsed.nodes[0].process_health == ProcessHealth(WebserverHealth(123, 4))


@pytest.mark.parametrize(
    ("health", "want"),
    [
        pytest.param(None, None, id="null"),
        pytest.param({}, ProcessHealth(None), id="empty"),
        pytest.param({"indexer": {}}, ProcessHealth(None), id="no webserver"),
        pytest.param({"webserver": {}}, ProcessHealth(WebserverHealth()), id="empty webserver"),
    ],
)
def test_process_health_may_be_absent_in_every_way(health, want):
    data = minimal()
    data["nodes"][0]["process_health"] = health
    assert parse_scenario(data).nodes[0].process_health == want


def test_projects_are_stored_in_project_namespace_id_order():
    data = minimal(
        projects=[
            {"project_namespace_id": 30, "project_id": 3, "repository_size": 1},
            {"project_namespace_id": 10, "project_id": 1, "repository_size": None},
            {"project_namespace_id": 20, "project_id": 2, "repository_size": 0},
        ]
    )
    ns = parse_scenario(data).namespaces[0]
    assert [p.project_namespace_id for p in ns.projects] == [10, 20, 30]


def test_node_and_namespace_order_is_kept():
    data = {
        "nodes": [
            {"id": 9, "unclaimed_storage_bytes": 1},
            {"id": 3, "unclaimed_storage_bytes": 100},
        ],
        "namespaces": [
            {"enabled_namespace_id": 5, "namespace_id": 50},
            {"enabled_namespace_id": 4, "namespace_id": 40},
        ],
    }
    parsed = parse_scenario(data)
    assert [n.id for n in parsed.nodes] == [9, 3]
    assert [ns.namespace_id for ns in parsed.namespaces] == [50, 40]


def test_negative_unclaimed_storage_is_allowed():
    data = minimal()
    data["nodes"][0]["unclaimed_storage_bytes"] = -10
    assert parse_scenario(data).nodes[0].unclaimed_storage_bytes == -10


@pytest.mark.parametrize(
    ("factor", "size", "scaled"),
    [
        pytest.param(3, 2048, 6144, id="integer"),
        pytest.param(3.0, 2048, 6144, id="integral float"),
        pytest.param(1.5, 3, 5, id="rounded up"),
        pytest.param(1.1, 100, 110, id="decimal, not binary"),
        pytest.param(0.5, 0, 0, id="zero stays zero"),
    ],
)
def test_scaled_size(factor, size, scaled):
    data = minimal()
    data["options"] = {"buffer_factor": factor}
    options = parse_scenario(data).options
    assert options.scale(size) == scaled
    assert type(options.scale(size)) is int


def test_an_integral_float_buffer_factor_is_stored_as_an_int():
    data = minimal()
    data["options"] = {"buffer_factor": 3.0}
    assert type(parse_scenario(data).options.buffer_factor) is int


def _dup_project_id(data):
    data["namespaces"][0]["projects"] = [
        {"project_namespace_id": 1, "project_id": 7, "repository_size": 1},
        {"project_namespace_id": 2, "project_id": 7, "repository_size": 1},
    ]


def _dup_root(data):
    data["namespaces"].append({"enabled_namespace_id": 99, "namespace_id": 2})


def _dup_replica(data):
    data["namespaces"][0]["existing_replicas"] = [
        {"id": 3, "state": "ready"},
        {"id": 3, "state": "pending"},
    ]


def _project(**fields):
    def mutate(data):
        project = {"project_namespace_id": 1, "project_id": 1, "repository_size": 1, **fields}
        data["namespaces"][0]["projects"] = [project]

    return mutate


def _missing_project_field(data):
    data["namespaces"][0]["projects"] = [{"project_namespace_id": 1, "project_id": 1}]


def _node(**fields):
    def mutate(data):
        data["nodes"][0].update(fields)

    return mutate


@pytest.mark.parametrize(
    ("mutate", "field_path"),
    [
        pytest.param(_dup_project_id, "namespaces[0].projects[1].project_id", id="dup project id"),
        pytest.param(_dup_root, "namespaces[1].namespace_id", id="dup root namespace"),
        pytest.param(_dup_replica, "namespaces[0].existing_replicas[1].id", id="dup replica id"),
        pytest.param(
            _project(repository_size=2.0),
            "namespaces[0].projects[0].repository_size",
            id="size a float",
        ),
        pytest.param(
            _project(project_id=None), "namespaces[0].projects[0].project_id", id="null project id"
        ),
        pytest.param(
            _missing_project_field,
            "namespaces[0].projects[0].repository_size",
            id="size missing (null must be explicit)",
        ),
        pytest.param(_project(extra=1), "namespaces[0].projects[0].extra", id="unknown field"),
        pytest.param(
            _node(memory_budget_bytes=-1), "nodes[0].memory_budget_bytes", id="negative budget"
        ),
        pytest.param(
            _node(process_health={"webserver": {"rss_bytes": "1"}}),
            "nodes[0].process_health.webserver.rss_bytes",
            id="rss a string",
        ),
        pytest.param(_node(process_health=[]), "nodes[0].process_health", id="health a list"),
    ],
)
def test_problems_name_their_field(mutate, field_path):
    data = minimal()
    mutate(data)
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    assert caught.value.field_path == field_path


def test_a_duplicated_key_takes_its_last_value_and_a_byte_order_mark_is_skipped():
    text = b'\xef\xbb\xbf{"nodes": [{"id": 1, "unclaimed_storage_bytes": 5}], "namespaces": [], '
    text += b'"nodes": [{"id": 2, "unclaimed_storage_bytes": 7}]}'
    assert [node.id for node in Scenario.from_json(text).nodes] == [2]


def test_from_json_reports_malformed_json_at_the_scenario_root():
    with pytest.raises(ScenarioError) as caught:
        Scenario.from_json('{"nodes": [1,]}')
    assert caught.value.field_path == "scenario"
    assert "malformed JSON" in caught.value.message
