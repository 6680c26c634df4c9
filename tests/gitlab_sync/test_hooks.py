"""System hooks: the receiver (token, duplicates, bad bodies) and the refetch of what
each event names, against the fake GitLab over HTTP."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from gitlab_sync import hooks, sweep
from gitlab_sync.models import HookEvent
from simulator.fakegitlab import FakeGitLab, serve
from tests.gitlab_sync.test_sweep import TOKEN, catalog, config, expected, fleet_of
from zoekt import clock
from zoekt.models import Namespace, Project, ProjectStatistics

pytestmark = pytest.mark.django_db

URL = "/api/v1/gitlab/system_hook"
SECRET = "hook-secret"


@pytest.fixture(autouse=True)
def hook_secrets(settings):
    settings.ZOEKT_GITLAB_HOOK_SECRETS = ["old-secret", SECRET]


@pytest.fixture
def gitlab():
    return FakeGitLab(TOKEN)


@pytest.fixture
def url(gitlab):
    with serve(gitlab) as base:
        yield base


def post(client, body, *, token=SECRET, uuid=None, raw=None):
    headers = {"X-Gitlab-Event": "System Hook"}
    if token is not None:
        headers["X-Gitlab-Token"] = token
    if uuid is not None:
        headers["X-Gitlab-Event-UUID"] = uuid
    data = raw if raw is not None else json.dumps(body)
    return client.post(URL, data=data, content_type="application/json", headers=headers)


def process(url: str):
    return hooks.process(sweep.client(config(url)), now=clock.now() + timedelta(hours=1))


@pytest.mark.parametrize("token", [None, "", "wrong", SECRET + "x"])
def test_a_missing_or_wrong_token_is_401_and_stores_nothing(client, token):
    response = post(client, {"event_name": "project_create", "project_id": 1}, token=token)
    assert response.status_code == 401
    assert set(response.json()["errors"]) == {"X-Gitlab-Token"}
    assert HookEvent.objects.count() == 0


def test_both_secrets_of_a_rotation_are_accepted(client):
    for i, token in enumerate(["old-secret", SECRET]):
        body = {"event_name": "project_create", "project_id": 10 + i}
        assert post(client, body, token=token).status_code == 204
    assert HookEvent.objects.count() == 2


def test_without_a_secret_configured_the_endpoint_is_404(client, settings):
    settings.ZOEKT_GITLAB_HOOK_SECRETS = []
    response = post(client, {"event_name": "project_create", "project_id": 1})
    assert response.status_code == 404
    assert HookEvent.objects.count() == 0


@pytest.mark.parametrize(
    "body, raw, field",
    [
        (None, "[1, 2]", "body"),
        (None, "{not json", "body"),
        ({"project_id": 1}, None, "event_name"),
        ({"event_name": "project_create"}, None, "project_id"),
        ({"event_name": "project_create", "project_id": "7"}, None, "project_id"),
        ({"event_name": "group_rename", "group_id": -1}, None, "group_id"),
    ],
)
def test_a_bad_body_is_400_naming_the_field_and_stores_nothing(client, body, raw, field):
    response = post(client, body, raw=raw)
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert HookEvent.objects.count() == 0


def test_an_event_not_followed_is_answered_and_dropped(client):
    assert post(client, {"event_name": "user_create", "user_id": 5}).status_code == 204
    assert HookEvent.objects.count() == 0


def test_a_redelivered_hook_is_applied_once(client, gitlab, url):
    fleet_of(gitlab, projects=5)
    sweep.run(config(url))
    gitlab.add_project(7_000, "new", 101)
    body = {"event_name": "project_create", "project_id": 7_000}
    for _ in range(3):
        assert post(client, body, uuid="3f1c0a8e-uuid").status_code == 204
    assert HookEvent.objects.count() == 1
    assert process(url) == {"written": 1}
    assert Project.objects.filter(id=7_000).exists()


def test_each_change_reaches_the_catalog_through_its_hook(client, gitlab, url):
    fleet_of(gitlab, projects=60)
    sweep.run(config(url))
    # A new group with a new project: the project's parent is fetched with it.
    gitlab.add_group(900, "brand-new", 100)
    gitlab.add_project(8_000, "fresh", 900)
    gitlab.projects[1_001].path = "renamed"
    gitlab.projects[1_002].namespace_id = 110
    gitlab.projects[1_003].archived = True
    del gitlab.projects[1_004]
    gitlab.groups[102].path = "renamed-group"
    gitlab.add_group(901, "another", None)
    gitlab.delete_group(115)
    events = [
        {"event_name": "project_create", "project_id": 8_000},
        {"event_name": "project_rename", "project_id": 1_001},
        {"event_name": "project_transfer", "project_id": 1_002},
        {"event_name": "project_update", "project_id": 1_003},
        {"event_name": "project_destroy", "project_id": 1_004},
        {"event_name": "group_rename", "group_id": 102},
        {"event_name": "group_create", "group_id": 901},
        {"event_name": "group_destroy", "group_id": 115},
    ]
    for k, body in enumerate(events):
        assert post(client, body, uuid=f"event-{k}").status_code == 204
    counts = process(url)
    assert counts == {"written": 6, "removed": 2}
    assert catalog() == expected(gitlab)
    assert HookEvent.objects.filter(state=HookEvent.State.DONE).count() == len(events)


def test_a_push_is_refetched_after_its_debounce_and_pushes_coalesce(client, gitlab, url):
    fleet_of(gitlab, projects=5)
    sweep.run(config(url))
    gitlab.projects[1_002].repository_size = 99 * 1024 * 1024
    for k in range(3):
        body = {"event_name": "repository_update", "project_id": 1_002}
        assert post(client, body, uuid=f"push-{k}").status_code == 204
    assert HookEvent.objects.count() == 1
    client_gl = sweep.client(config(url))
    assert hooks.process(client_gl, now=clock.now()) == {}  # not yet: GitLab still counts
    assert process(url) == {"written": 1}
    assert Project.objects.get(id=1_002).statistics.repository_size == 99 * 1024 * 1024


def test_gitlab_down_while_refetching_is_tried_again_later(client, gitlab, url):
    fleet_of(gitlab, projects=5)
    sweep.run(config(url))
    gitlab.add_project(7_001, "later", 101)
    post(client, {"event_name": "project_create", "project_id": 7_001}, uuid="e1")
    gitlab.token = "rotated"  # every request is now a 401
    assert process(url) == {"pending": 1}
    event = HookEvent.objects.get()
    assert event.attempts == 1 and "401" in event.error
    assert not Project.objects.filter(id=7_001).exists()
    gitlab.token = TOKEN
    later = clock.now() + timedelta(hours=2)
    assert hooks.process(sweep.client(config(url)), now=later) == {"written": 1}
    assert Project.objects.filter(id=7_001).exists()


def test_the_admin_lists_the_hooks_received(admin_client, client):
    post(client, {"event_name": "project_create", "project_id": 42}, uuid="seen-in-admin")
    page = admin_client.get("/admin/gitlab_sync/hookevent/?state=pending")
    assert page.status_code == 200
    assert "project_create" in page.content.decode()


def test_the_surfaces_show_the_sweeps_and_the_hook_backlog(client, admin_client, gitlab, url):
    import io

    from django.core.management import call_command

    fleet_of(gitlab, projects=5)
    record = sweep.run(config(url))
    post(client, {"event_name": "project_update", "project_id": 1_001}, uuid="due")
    HookEvent.objects.update(process_after=clock.now() - timedelta(seconds=90))

    out = io.StringIO()
    call_command("zoekt_info", "--json", stdout=out)
    info = json.loads(out.getvalue())["gitlab"]
    last = info["last_sweep"]
    assert (last["id"], last["state"], last["phase"]) == (record.id, "complete", "done")
    assert last["projects_written"] == 5
    assert info["hook_events"]["counts"]["pending"] == 1
    assert info["hook_lag_seconds"] >= 90

    metrics = admin_client.get("/metrics").content.decode()
    assert 'zoekt_control_gitlab_hook_events{state="pending"} 1.0' in metrics
    assert 'zoekt_control_gitlab_last_sweep_projects{what="written"} 5.0' in metrics
    lag = [
        line
        for line in metrics.splitlines()
        if line.startswith("zoekt_control_gitlab_hook_lag_seconds")
    ]
    assert float(lag[0].split()[-1]) >= 90


def test_the_dashboard_shows_the_sweeps_and_the_hook_backlog(client, admin_client, gitlab, url):
    fleet_of(gitlab, projects=5)
    record = sweep.run(config(url))
    post(client, {"event_name": "project_update", "project_id": 1_001}, uuid="backlog")
    page = admin_client.get("/admin/dashboard/gitlab/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-sweep-id="{record.id}"' in html
    assert 'data-figure="hooks-pending"><span class="value">1<' in html
    assert "project_update" in html
    assert 'data-page="gitlab"' in html


def test_handled_events_are_pruned_after_a_week_and_pending_ones_never(client):
    for k in range(3):
        post(client, {"event_name": "project_create", "project_id": 50 + k}, uuid=f"p{k}")
    old = clock.now() - timedelta(days=8)
    first, second, third = HookEvent.objects.order_by("id")
    HookEvent.objects.filter(id=first.id).update(state=HookEvent.State.DONE, processed_at=old)
    HookEvent.objects.filter(id=second.id).update(state=HookEvent.State.FAILED, processed_at=old)
    HookEvent.objects.filter(id=third.id).update(received_at=old, process_after=old)
    assert hooks.prune() == 2
    assert list(HookEvent.objects.values_list("id", flat=True)) == [third.id]


def deliver(client, url, *events) -> dict:
    for k, body in enumerate(events):
        assert post(client, body, uuid=f"{body['event_name']}-{k}").status_code == 204
    return process(url)


def test_a_project_without_statistics_gets_no_row_through_its_hook_and_keeps_its_last(
    client, gitlab, url
):
    fleet_of(gitlab, projects=20)
    sweep.run(config(url))
    gitlab.add_project(7_100, "no-stats-yet", 101, has_statistics=False)
    gitlab.projects[1_005].has_statistics = False  # had statistics; GitLab now says null
    kept = ProjectStatistics.objects.get(project_id=1_005)

    counts = deliver(
        client,
        url,
        {"event_name": "project_create", "project_id": 7_100},
        {"event_name": "project_update", "project_id": 1_005},
    )

    assert counts == {"written": 2}
    assert Project.objects.filter(id=7_100).exists()
    assert not ProjectStatistics.objects.filter(project_id=7_100).exists()
    again = ProjectStatistics.objects.get(project_id=1_005)
    assert (again.repository_size, again.storage_size) == (kept.repository_size, kept.storage_size)
    gitlab.projects[1_005].has_statistics = True  # what the catalog still holds
    assert catalog() == expected(gitlab)


def test_a_removal_by_a_hook_leaves_each_root_the_totals_of_what_remains(client, gitlab, url):
    fleet_of(gitlab, projects=300)
    sweep.run(config(url))
    doomed = [p for p in gitlab.projects.values() if p.namespace_id == 101]
    assert len(doomed) == 3 and gitlab.root_of(101) == 100
    before = catalog()["roots"]
    gitlab.delete_group(101)  # a subgroup of root 100 with its three projects
    gone = gitlab.projects.pop(1_110)  # a project of root 105
    gitlab.projects[1_120].namespace_id = 110  # a project moved to another root

    counts = deliver(
        client,
        url,
        {"event_name": "group_destroy", "group_id": 101},
        {"event_name": "project_destroy", "project_id": 1_110},
        {"event_name": "project_transfer", "project_id": 1_120},
    )

    assert counts == {"removed": 2, "written": 1}
    assert catalog() == expected(gitlab)  # every root's totals: the sums of what remains
    after = catalog()["roots"]
    assert before[100][0] - after[100][0] == sum(p.repository_size for p in doomed)
    assert before[105][0] - after[105][0] == gone.repository_size


def test_a_project_in_a_new_personal_namespace_arrives_with_it_through_its_hook(
    client, gitlab, url
):
    fleet_of(gitlab, projects=10)
    sweep.run(config(url))
    gitlab.add_user(90_077, "newcomer")
    gitlab.add_project(9_000, "first", 90_077, repository_size=4_096)

    assert deliver(client, url, {"event_name": "project_create", "project_id": 9_000}) == {
        "written": 1
    }
    assert Namespace.objects.get(id=90_077).type == Namespace.Type.USER
    assert catalog() == expected(gitlab)
    assert catalog()["roots"][90_077] == (4_096, 4_096)
