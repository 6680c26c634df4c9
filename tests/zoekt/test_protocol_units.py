"""Small units of the task wire format that the HTTP tests do not reach."""

from __future__ import annotations

import pytest

from tests.factories import ProjectFactory, RepositoryFactory
from zoekt import app_settings, protocol
from zoekt.models import Project, Task


@pytest.mark.parametrize(
    ("address", "expected_suffix"),
    [
        ("unix:/var/opt/gitlab/gitaly/gitaly.socket", "unix:/var/opt/gitlab/gitaly/gitaly.socket"),
        ("tcp://gitaly:8075", "tcp://gitaly:8075"),
        ("unix:var/gitaly.socket", "/var/gitaly.socket"),
    ],
    ids=["absolute unix socket kept", "tcp kept", "relative unix socket made absolute"],
)
def test_gitaly_addresses_are_absolute(settings, address, expected_suffix):
    result = protocol.gitaly_address(address)
    assert result.endswith(expected_suffix)
    if address.startswith("unix:var"):
        assert result == f"unix:{(settings.BASE_DIR / 'var/gitaly.socket').resolve()}"
    else:
        assert result == address


@pytest.mark.django_db
def test_a_task_whose_project_vanished_after_hand_out_is_left_out_of_the_reply():
    kept = RepositoryFactory(project=ProjectFactory(repository_size=1024))
    gone = RepositoryFactory(project=ProjectFactory(repository_size=1024))
    tasks = [
        Task(
            id=1,
            zoekt_node_id=1,
            zoekt_repository_id=kept.id,
            project_identifier=kept.project_identifier,
            task_type=Task.TaskType.INDEX_REPO,
        ),
        Task(
            id=2,
            zoekt_node_id=1,
            zoekt_repository_id=gone.id,
            project_identifier=gone.project_identifier,
            task_type=Task.TaskType.INDEX_REPO,
        ),
    ]
    Project.objects.filter(id=gone.project_identifier).delete()

    wire = protocol.serialize_tasks(
        tasks, node_schema_version=7, zoekt_settings=app_settings.current()
    )

    assert [t["payload"]["Callback"]["payload"]["task_id"] for t in wire] == [1]
    assert wire[0]["payload"]["RepoId"] == kept.project_identifier


@pytest.mark.parametrize("as_form_string", [False, True], ids=["object", "json-string"])
def test_the_heartbeat_serializer_collects_unknown_keys_as_dotted_paths(as_form_string):
    import json

    from api.serializers import HeartbeatSerializer

    health = {"indexer": {"rss_bytes": 1, "restarts": 2}, "webserver": {"uptime": 3}, "gpu": {}}
    body = {
        "uuid": "ignored",
        "node.url": "http://zoekt-0:6065",
        "node.name": "zoekt-0",
        "node.next": True,
        "disk.all": 10,
        "disk.used": 1,
        "process_health": json.dumps(health) if as_form_string else health,
    }

    serializer = HeartbeatSerializer(data=body)

    assert serializer.is_valid(), serializer.errors
    assert sorted(serializer.unknown_keys) == [
        "node.next",
        "process_health.gpu",
        "process_health.indexer.restarts",
        "process_health.webserver.uptime",
    ]
    assert serializer.validated_data["process_health"] == {
        "indexer": {"rss_bytes": 1},
        "webserver": {},
    }
    assert "uuid" not in serializer.validated_data


def test_the_callback_payload_is_kept_whole_and_its_keys_are_not_unknown():
    from api.serializers import CallbackSerializer

    payload = {"task_id": 5, "schema_version": 1, "trace": {"id": "x"}}
    serializer = CallbackSerializer(
        data={"name": "index", "success": True, "payload": payload, "extra": 1}
    )

    assert serializer.is_valid(), serializer.errors
    assert serializer.validated_data["payload"] == payload
    assert serializer.unknown_keys == ["extra"]
