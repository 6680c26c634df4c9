"""End to end: a fake GitLab swept into the catalog, a namespace enabled and rolled out,
fake nodes indexing over HTTP, search covering every project (``search_targets``, the
routing view and GitLab's search request); then a project deleted in GitLab leaves the
node; and during a move, GitLab's request gives every permitted project exactly once."""

from __future__ import annotations

import pytest
from django.db import transaction

from config.celery import app as celery_app
from eviction import moves
from eviction.policy import Chosen
from gitlab_sync import sweep
from simulator.fakegitlab import FakeGitLab, serve
from simulator.fakenode import FakeNode
from zoekt import app_settings
from zoekt.models import Index, Move, Node, Project, Repository
from zoekt.operator_actions import do_enable_namespace
from zoekt.search_requests import search_request
from zoekt.search_routing import search_routing
from zoekt.search_targets import search_targets

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "glpat-e2e"


def converge(nodes: list[FakeNode], done, *, rounds: int = 40) -> None:
    """Rollout, a scheduling pass and a step of every node, until ``done()``."""
    from planner.tasks import rollout_task
    from zoekt.scheduling.service import TASKS
    from zoekt.scheduling.tasks import run_scheduled_task

    for _ in range(rounds):
        rollout_task()
        for name in TASKS:
            run_scheduled_task(name, bypass_throttle=True)
        for node in nodes:
            assert node.step().heartbeat.status == 200
        if done():
            return
    raise AssertionError("did not converge")


def acme_gitlab() -> FakeGitLab:
    """Root group 100 with a subgroup and eight projects; another root with one."""
    gitlab = FakeGitLab(TOKEN)
    gitlab.add_group(100, "acme")
    gitlab.add_group(101, "tools", 100)
    gitlab.add_group(200, "other")
    for k in range(8):
        gitlab.add_project(1_000 + k, f"repo-{k}", 100 if k % 2 else 101)
    gitlab.add_project(2_000, "elsewhere", 200)
    return gitlab


def test_sweep_enable_index_search_and_delete(make_fake_node, monkeypatch):
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)
    app_settings.update(zoekt_indexing_enabled=True, zoekt_search_enabled=True)
    gitlab = acme_gitlab()
    nodes = [make_fake_node(f"zoekt-{i}", concurrency=2, task_delay=(0.0, 0.01)) for i in range(2)]
    with serve(gitlab) as url:
        config = sweep.Config(url=url, token=TOKEN, timeout=10)
        sweep.run(config)
        for node in nodes:
            node.step()
        do_enable_namespace(0, 100, search=True)

        acme = set(
            Project.objects.filter(namespace__traversal_ids__0=100).values_list("id", flat=True)
        )
        assert acme == {1_000 + k for k in range(8)}

        def searchable() -> bool:
            return (
                bool(search_targets(100).targets)
                and not Repository.objects.exclude(state=Repository.State.READY).exists()
            )

        converge(nodes, searchable)

        plan = search_routing(100)
        planned = {pid for ids in plan["targets"].values() for pid in ids}
        assert planned == acme
        assert plan["proxy"]["url"].endswith("/webserver/api/v2/search")
        held = set().union(*(set(node.repos) for node in nodes))
        assert held == acme  # the other root was not enabled

        # The project is deleted in GitLab: the next sweep removes it, and the
        # deletion pipeline takes its repository off the node.
        del gitlab.projects[1_003]
        sweep.run(config)
        assert not Project.objects.filter(id=1_003).exists()

        def gone() -> bool:
            return not Repository.objects.filter(project_identifier=1_003).exists()

        converge(nodes, gone)
        assert 1_003 not in set().union(*(set(node.repos) for node in nodes))
        assert {pid for ids in search_routing(100)["targets"].values() for pid in ids} == (
            acme - {1_003}
        )


def given_once(request: dict) -> dict[int, str]:
    """``{project id: endpoint}`` of GitLab's request, failing on a project given twice."""
    out: dict[int, str] = {}
    for entry in request["forward_to"]:
        assert set(entry) == {"query", "endpoint"}
        query, project_filter = entry["query"]["and"]["children"]
        assert query == {"query_string": {"query": "test"}}
        for pid in project_filter["repo_ids"]:
            assert pid not in out, f"project {pid} given twice"
            out[pid] = entry["endpoint"]
    return out


def test_during_a_move_every_permitted_project_is_given_once(make_fake_node, monkeypatch):
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)
    app_settings.update(zoekt_indexing_enabled=True, zoekt_search_enabled=True)
    gitlab = acme_gitlab()
    nodes = [make_fake_node(f"zoekt-{i}", concurrency=2, task_delay=(0.0, 0.01)) for i in range(2)]
    # The caller may search all of acme but one project, and one project of another root.
    permitted = [1_000 + k for k in range(8) if k != 5] + [2_000]
    with serve(gitlab) as url:
        sweep.run(sweep.Config(url=url, token=TOKEN, timeout=10))
        for node in nodes:
            node.step()
        do_enable_namespace(0, 100, search=True)
        converge(
            nodes,
            lambda: (
                bool(search_targets(100).targets)
                and not Repository.objects.exclude(state=Repository.State.READY).exists()
            ),
        )

        def check() -> dict[int, str]:
            answer = search_request(100, "test", permitted)
            assert answer["search_enabled"] is True
            assert answer["unrouted_project_ids"] == [2_000]
            given = given_once(answer["request"])
            assert sorted(given) == permitted[:-1]
            return given

        source = Index.objects.get(zoekt_enabled_namespace__root_namespace_id=100)
        source_node = Node.objects.get(pk=source.zoekt_node_id)
        check()
        with transaction.atomic():
            started = moves.start_moves(
                [Chosen(source.id, 100, source.zoekt_replica_id, source.used_storage_bytes)],
                source=source_node,
                trigger="node_level",
                critical=False,
                target_ceiling=0.70,
            )
        (move,) = started.moves
        move.refresh_from_db()
        assert move.state == Move.State.BUILDING

        def built() -> bool:
            return Index.objects.filter(
                pk=move.replacement_index_id, state=Index.State.READY
            ).exists()

        converge(nodes, built)
        # Both copies are whole: the replacement is ready, the source still serves.
        by_name = {node.config.name: node for node in nodes}
        target_name = Node.objects.get(pk=move.target_node_id).name
        for copy in (source_node.name, target_name):
            assert set(permitted[:-1]) <= set(by_name[copy].repos)
        assert set(check().values()) == {source_node.search_base_url}

        assert moves.advance_moves() == {"done": 1}
        # Swapped: the source's node still holds its copy until the deletion runs.
        assert set(permitted[:-1]) <= set(by_name[source_node.name].repos)
        target_url = Node.objects.get(pk=move.target_node_id).search_base_url
        assert set(check().values()) == {target_url}

        converge(nodes, lambda: not by_name[source_node.name].repos)
        assert set(check().values()) == {target_url}
