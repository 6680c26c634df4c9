"""The sweep against a fake GitLab over HTTP (``simulator.fakegitlab``): pages with
``Link`` headers, 429 with ``Retry-After`` and occasional 502s, as GitLab answers."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from gitlab_sync import rows, sweep
from gitlab_sync.models import Seen, Sweep
from planner.rollout import RolloutService
from simulator.fakegitlab import FakeGitLab, serve
from tests.factories import EnabledNamespaceFactory, NodeFactory
from tests.locking import session_lock_held_elsewhere
from zoekt.catalog import do_bulk_upsert_catalog
from zoekt.catalog_rows import group_row, project_rows
from zoekt.locks import LockKey
from zoekt.models import Namespace, NamespaceRootStorageStatistics, Project, ProjectStatistics

pytestmark = pytest.mark.django_db

TOKEN = "glpat-admin"


def fleet_of(gitlab: FakeGitLab, *, roots: int = 20, subgroups: int = 4, projects: int = 300):
    """``roots`` top-level groups of ``subgroups`` subgroups each (one of them nested one
    deeper), three users, and ``projects`` projects spread over all of them; every 17th
    project has no statistics yet (GitLab answers ``statistics: null``)."""
    gid = 100
    homes = []
    for r in range(roots):
        root = gitlab.add_group(gid, f"root-{r}")
        gid += 1
        homes.append(root.id)
        for s in range(subgroups):
            parent = root.id if s < subgroups - 1 else gid - 1
            gitlab.add_group(gid, f"sub-{r}-{s}", parent, visibility="internal")
            homes.append(gid)
            gid += 1
    for u in range(3):
        gitlab.add_user(90_000 + u, f"user{u}")
        homes.append(90_000 + u)
    for p in range(projects):
        gitlab.add_project(
            1_000 + p,
            f"project-{p}",
            homes[p % len(homes)],
            repository_size=(p % 7 + 1) * 1024 * 1024,
            archived=p % 11 == 0,
            forked_from_id=1_000 + p - 5 if p % 13 == 12 else None,
            has_statistics=p % 17 != 16,
        )
    return gitlab


@pytest.fixture
def gitlab():
    return FakeGitLab(TOKEN, rate_limit_every=17, error_every=23, retry_after=0)


@pytest.fixture
def url(gitlab):
    with serve(gitlab) as base:
        yield base


def config(url: str, **kw) -> sweep.Config:
    return sweep.Config(url=url, token=TOKEN, timeout=10, **kw)


def catalog() -> dict:
    groups = {
        n.id: (n.name, n.path, n.parent_id, list(n.traversal_ids), n.visibility_level)
        for n in Namespace.objects.filter(type=Namespace.Type.GROUP)
    }
    users = set(Namespace.objects.filter(type=Namespace.Type.USER).values_list("id", flat=True))
    projects = {
        p.id: (p.path, p.namespace_id, p.project_namespace_id, p.archived)
        for p in Project.objects.all()
    }
    sizes = dict(ProjectStatistics.objects.values_list("project_id", "repository_size"))
    roots = {
        s.namespace_id: (s.repository_size, s.storage_size)
        for s in NamespaceRootStorageStatistics.objects.all()
    }
    return {"groups": groups, "users": users, "projects": projects, "sizes": sizes, "roots": roots}


def expected(gitlab: FakeGitLab) -> dict:
    def chain(gid: int) -> list[int]:
        out = []
        while gid is not None:
            out.append(gid)
            gid = gitlab.groups[gid].parent_id
        return list(reversed(out))

    return {
        "groups": {
            g.id: (
                g.name or g.path,
                g.path,
                g.parent_id,
                chain(g.id),
                rows.VISIBILITY_LEVELS[g.visibility],
            )
            for g in gitlab.groups.values()
        },
        "users": set(gitlab.users),
        "projects": {
            p.id: (p.path, p.namespace_id, rows.project_namespace_id(p.id), p.archived)
            for p in gitlab.projects.values()
        },
        "sizes": {p.id: p.repository_size for p in gitlab.projects.values() if p.has_statistics},
        "roots": gitlab.root_storage_statistics(),
    }


def test_a_first_sweep_fills_the_catalog_exactly_through_rate_limits_and_errors(gitlab, url):
    fleet_of(gitlab)
    record = sweep.run(config(url))
    assert record.state == Sweep.State.COMPLETE and record.phase == Sweep.Phase.DONE
    assert catalog() == expected(gitlab)
    # Traversal ids of a project's namespace end with its surrogate id, under its parent.
    project = Project.objects.get(id=1_005)
    own = Namespace.objects.get(id=project.project_namespace_id)
    parent = Namespace.objects.get(id=project.namespace_id)
    assert list(own.traversal_ids) == [*parent.traversal_ids, own.id]
    # Forks are linked; every 429 and 502 was retried and the sweep still saw everything.
    assert Project.objects.get(id=1_012).fork_network_member.forked_from_project_id == 1_007
    answers = record.counts["answers"]
    assert answers.get("429", 0) > 0 and answers.get("502", 0) > 0
    assert record.counts["projects"] == 300 and record.counts["skipped"] == 0


def test_changes_in_gitlab_reach_the_catalog_with_the_next_sweep(gitlab, url):
    fleet_of(gitlab)
    sweep.run(config(url))
    gitlab.projects[1_001].path = "renamed"  # project_rename
    gitlab.projects[1_002].namespace_id = 101  # project_transfer
    gitlab.projects[1_003].archived = True  # project_update (archived)
    del gitlab.projects[1_004]  # project_destroy
    gitlab.add_project(5_000, "created", 102)  # project_create
    gitlab.groups[102].path = "renamed-group"  # group_rename
    gitlab.groups[103].parent_id = 110  # a group transfer: no hook at all in GitLab
    gitlab.delete_group(115)  # group_destroy, with what is under it
    gitlab.users.pop(90_002)
    for project in [p for p in gitlab.projects.values() if p.namespace_id == 90_002]:
        del gitlab.projects[project.id]
    moved_before = Project.objects.get(id=1_002).project_namespace_id

    record = sweep.run(config(url))

    assert catalog() == expected(gitlab)
    # A transferred project keeps its place in its index ranges: its key did not change.
    assert Project.objects.get(id=1_002).project_namespace_id == moved_before
    assert record.counts["removed"]["projects"] > 0
    assert not Namespace.objects.filter(id=rows.project_namespace_id(1_004)).exists()
    # What the sweep saw is all the seen table holds.
    assert Seen.objects.exclude(sweep_id=record.id).count() == 0


def test_an_interrupted_sweep_resumes_where_it_stopped(gitlab, url):
    fleet_of(gitlab, projects=450)
    gitlab.rate_limit_every = gitlab.error_every = 0
    batches = []

    def stop_after_two_project_batches(line: str) -> None:
        if line.startswith("projects"):
            batches.append(line)
            if len(batches) == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep.run(config(url), progress=stop_after_two_project_batches)
    stopped = Sweep.objects.get()
    assert stopped.state == Sweep.State.RUNNING and stopped.phase == Sweep.Phase.PROJECTS
    assert stopped.cursor["project_after"] == 1_199
    groups_listed = gitlab.requests["groups"]

    record = sweep.run(config(url))

    assert record.id == stopped.id and record.state == Sweep.State.COMPLETE
    assert catalog() == expected(gitlab)
    # The groups were not walked again, and the projects went on from the cursor.
    assert gitlab.requests["groups"] == groups_listed
    assert gitlab.requests["projects"] == 2 + 3


@pytest.mark.parametrize("token, admin", [("glpat-wrong", True), (TOKEN, False)])
def test_a_token_that_cannot_see_all_of_gitlab_writes_nothing(gitlab, url, token, admin):
    fleet_of(gitlab, projects=20)
    gitlab.admin = admin
    with pytest.raises(sweep.SweepError):
        sweep.run(sweep.Config(url=url, token=token, timeout=10))
    assert Namespace.objects.count() == 0 and Project.objects.count() == 0
    assert Sweep.objects.get().state == Sweep.State.FAILED


def test_a_sweep_that_would_remove_most_of_the_catalog_removes_nothing(gitlab, url):
    # A catalog filled by the bulk API, of which GitLab knows nothing.
    ns = [group_row(7, "elsewhere")]
    projects, stats = [], []
    for k in range(150):
        own, project, size = project_rows(
            70_000 + k,
            f"p{k}",
            namespace_id=7,
            project_namespace_id=80_000 + k,
            repository_size=10,
        )
        ns.append(own)
        projects.append(project)
        stats.append(size)
    do_bulk_upsert_catalog(ns, projects, stats)
    fleet_of(gitlab, projects=10)

    with pytest.raises(sweep.SweepError, match="would remove 150 of 160 projects"):
        sweep.run(config(url))
    assert Project.objects.filter(id__gte=70_000).count() == 150

    record = sweep.run(config(url, allow_mass_removal=True), restart=True)
    assert record.counts["removed"]["projects"] == 150
    assert catalog() == expected(gitlab)


def test_a_project_the_catalog_refuses_is_skipped_and_named(gitlab, url):
    fleet_of(gitlab, projects=30)
    gitlab.projects[1_003].repository_storage = "nowhere"
    record = sweep.run(config(url))
    assert record.state == Sweep.State.COMPLETE
    assert record.counts["skipped"] == 1
    (skipped,) = record.counts["skipped_objects"]
    assert skipped["id"] == 1_003 and "repository_storage" in skipped["reason"]
    assert not Project.objects.filter(id=1_003).exists()
    assert Project.objects.count() == 29


def test_the_statements_per_page_do_not_grow_with_the_projects(gitlab, url):
    gitlab.rate_limit_every = gitlab.error_every = 0
    fleet_of(gitlab, roots=2, subgroups=1, projects=100)
    with CaptureQueriesContext(connection) as small:
        sweep.run(config(url))
    Sweep.objects.all().delete()
    Seen.objects.all().delete()
    for p in range(100, 400):
        gitlab.add_project(1_000 + p, f"project-{p}", 100)
    with CaptureQueriesContext(connection) as large:
        sweep.run(config(url))
    # Four pages where there was one: the statements grow by pages, not by projects.
    per_page = (len(large) - len(small)) / 3
    assert per_page < 40, per_page


def test_only_one_sweep_runs_at_a_time():
    now = "2026-12-01T00:00:00Z"
    Sweep.objects.create(gitlab_url="x", started_at=now, updated_at=now)
    with pytest.raises(IntegrityError), transaction.atomic():
        Sweep.objects.create(gitlab_url="x", started_at=now, updated_at=now)


def test_the_command_sweeps_and_says_what_it_did(gitlab, url, tmp_path, capsys):
    fleet_of(gitlab, projects=40)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    call_command("zoekt_gitlab_sync", "--url", url, "--token-file", str(token))
    out = capsys.readouterr()
    assert f"full sweep {Sweep.objects.get().id} complete: 100 groups, 3 users, 40 projects" in (
        out.out
    )
    assert "[gitlab] projects:" in out.err
    assert catalog() == expected(gitlab)

    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(CommandError, match="is empty"):
        call_command("zoekt_gitlab_sync", "--url", url, "--token-file", str(empty))


def test_the_admin_lists_the_sweeps(admin_client, gitlab, url):
    fleet_of(gitlab, projects=10)
    record = sweep.run(config(url))
    page = admin_client.get("/admin/gitlab_sync/sweep/")
    assert page.status_code == 200
    assert f">{record.id}<" in page.content.decode()
    assert admin_client.get(f"/admin/gitlab_sync/sweep/{record.id}/change/").status_code == 200


def test_a_delta_sweep_reads_what_changed_and_removes_nothing(gitlab, url):
    fleet_of(gitlab, projects=200)
    first = sweep.run(config(url))
    gitlab.rate_limit_every = gitlab.error_every = 0
    # Active since: renamed and resized, one of them moved. A group moved (no hook in
    # GitLab) and one archived. A project deleted: only a full sweep removes it.
    for pid in (1_010, 1_020):
        gitlab.projects[pid].path = f"active-{pid}"
        gitlab.projects[pid].repository_size = 77 * 1024 * 1024
        gitlab.projects[pid].last_activity_at = "2099-01-01T00:00:00+00:00"
    gitlab.projects[1_020].namespace_id = 110
    gitlab.groups[103].parent_id = 110
    gitlab.groups[107].archived = True
    del gitlab.projects[1_030]
    before = gitlab.requests["projects"]

    delta = sweep.run(config(url), kind="delta")

    assert delta.kind == Sweep.Kind.DELTA and delta.state == Sweep.State.COMPLETE
    assert delta.cursor["since"] < first.started_at.isoformat()
    assert delta.counts["projects"] == 2 and delta.counts["groups"] == 2
    assert "removed" not in delta.counts
    assert gitlab.requests["projects"] - before == 1  # one page: the active ones
    now = catalog()
    want = expected(gitlab)
    assert now["groups"] == want["groups"]
    for pid in (1_010, 1_020):
        assert now["projects"][pid] == want["projects"][pid]
        assert now["sizes"][pid] == 77 * 1024 * 1024
    assert 1_030 in now["projects"]  # still there: deletions wait for the full sweep
    sweep.run(config(url))
    assert catalog() == expected(gitlab)


def test_a_delta_without_a_complete_sweep_before_it_is_a_full_sweep(gitlab, url):
    fleet_of(gitlab, projects=20)
    record = sweep.run(config(url), kind="delta")
    assert record.kind == Sweep.Kind.FULL
    assert catalog() == expected(gitlab)


def test_a_second_process_does_not_sweep_while_one_does(gitlab, url):
    fleet_of(gitlab, projects=5)
    with session_lock_held_elsewhere(LockKey.GITLAB_SWEEP), pytest.raises(sweep.SweepBusy):
        sweep.run(config(url))
    assert Sweep.objects.count() == 0
    assert sweep.run(config(url)).state == Sweep.State.COMPLETE


ACTIVE = "2099-01-01T00:00:00+00:00"  # after any delta's ``last_activity_after``


def test_a_project_without_statistics_gets_no_row_and_one_that_loses_them_keeps_its_last(
    gitlab, url
):
    fleet_of(gitlab, projects=60)
    gitlab.add_user(90_050, "newcomer")  # a root whose only project has no statistics
    gitlab.add_project(6_000, "fresh", 90_050, has_statistics=False, repository_size=5_000)
    without = {p.id for p in gitlab.projects.values() if not p.has_statistics}
    assert without == {1_016, 1_033, 1_050, 6_000}

    sweep.run(config(url))

    assert catalog() == expected(gitlab)
    assert not ProjectStatistics.objects.filter(project_id__in=without).exists()
    assert ProjectStatistics.objects.count() == len(gitlab.projects) - len(without)
    # The planner's rule for a project without statistics applies: the root waits.
    NodeFactory(total_bytes=10**9, used_bytes=0, indexed_bytes=0)
    EnabledNamespaceFactory(root_namespace=Namespace.objects.get(id=90_050))
    result = RolloutService().execute(dry_run=True)
    assert [(s["namespace_id"], s["reason"]) for s in result.summary()["namespaces_skipped"]] == [
        (90_050, "waiting_for_project_statistics")
    ]

    # GitLab answers null for a project it had statistics for: the last row is kept.
    gitlab.projects[1_005].has_statistics = False
    kept = ProjectStatistics.objects.get(project_id=1_005)
    sweep.run(config(url))
    gitlab.projects[1_005].has_statistics = True  # what the catalog still holds
    assert catalog() == expected(gitlab)
    again = ProjectStatistics.objects.get(project_id=1_005)
    assert (again.repository_size, again.storage_size) == (kept.repository_size, kept.storage_size)


def test_a_removal_by_the_sweep_leaves_each_root_the_totals_of_what_remains(gitlab, url):
    fleet_of(gitlab)
    sweep.run(config(url))
    assert catalog()["roots"] == expected(gitlab)["roots"]
    doomed = [p for p in gitlab.projects.values() if p.namespace_id == 101]
    assert len(doomed) == 3 and gitlab.root_of(101) == 100
    doomed_bytes = sum(p.repository_size for p in doomed)
    gitlab.delete_group(101)  # a subgroup of root 100 with its three projects
    del gitlab.projects[1_110]  # a project of root 105
    gitlab.projects[1_120].namespace_id = 110  # a project moved to another root
    gitlab.groups[108].parent_id = 115  # a group moved to another root
    gitlab.users.pop(90_001)  # a personal namespace, with its projects
    for project in [p for p in gitlab.projects.values() if p.namespace_id == 90_001]:
        del gitlab.projects[project.id]
    before = catalog()["roots"]

    record = sweep.run(config(url))

    assert catalog() == expected(gitlab)  # every root's totals: the sums of what remains
    assert before[100][0] - catalog()["roots"][100][0] == doomed_bytes
    assert record.counts["removed"]["namespaces"] == 2
    assert 90_001 not in catalog()["roots"]  # a removed root's totals go with it


def test_a_delta_sweep_follows_a_group_display_name_change(gitlab, url):
    fleet_of(gitlab, projects=30)
    sweep.run(config(url))
    gitlab.groups[102].name = "Platform Team"  # the display name only: the path stays
    gitlab.groups[100].name = "Acme Corporation"

    delta = sweep.run(config(url), kind="delta")

    assert delta.kind == Sweep.Kind.DELTA and delta.counts["groups"] == 2
    assert Namespace.objects.get(id=102).name == "Platform Team"
    assert Namespace.objects.get(id=100).name == "Acme Corporation"
    assert Namespace.objects.get(id=102).path == "sub-0-1"
    assert catalog() == expected(gitlab)
    # Nothing else changed: the next delta writes no group.
    assert sweep.run(config(url), kind="delta").counts["groups"] == 0


def test_a_delta_sweep_writes_a_project_in_a_personal_namespace_created_since_the_full_sweep(
    gitlab, url
):
    fleet_of(gitlab, projects=30)
    sweep.run(config(url))
    gitlab.add_user(90_077, "newcomer")
    gitlab.add_project(9_000, "first", 90_077, repository_size=4_096, last_activity_at=ACTIVE)

    for _ in range(2):  # twice: the second finds both there and changes nothing
        delta = sweep.run(config(url), kind="delta")
        assert delta.kind == Sweep.Kind.DELTA and delta.state == Sweep.State.COMPLETE
        assert delta.counts["skipped"] == 0 and delta.counts["projects"] == 1
        assert catalog() == expected(gitlab)
    assert Namespace.objects.get(id=90_077).type == Namespace.Type.USER
    assert Project.objects.get(id=9_000).namespace_id == 90_077
    assert catalog()["roots"][90_077] == (4_096, 4_096)
    assert Namespace.objects.filter(id=90_077).count() == 1
    # The next full sweep finds the catalog as it should be and removes nothing.
    record = sweep.run(config(url))
    assert record.counts["removed"] == {"projects": 0, "namespaces": 0, "project_namespaces": 0}
    assert catalog() == expected(gitlab)


def test_a_delta_sweep_moving_a_group_to_another_root_moves_its_totals(gitlab, url):
    fleet_of(gitlab, projects=60)
    sweep.run(config(url))
    gitlab.groups[103].parent_id = 110  # root 100 to root 110, with its subgroup 104

    sweep.run(config(url), kind="delta")

    assert catalog() == expected(gitlab)
