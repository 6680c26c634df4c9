"""End to end: a fake GitLab swept into the catalog, a namespace enabled and rolled out,
fake nodes indexing over HTTP, search covering every project (``search_targets`` and the
GitLab-shaped plan); then a project deleted in GitLab leaves the node."""

from __future__ import annotations

import pytest

from config.celery import app as celery_app
from gitlab_sync import sweep
from simulator.fakegitlab import FakeGitLab, serve
from simulator.fakenode import FakeNode
from zoekt import app_settings
from zoekt.models import Project, Repository
from zoekt.operator_actions import do_enable_namespace
from zoekt.search_plans import gitlab_plan
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


def test_sweep_enable_index_search_and_delete(make_fake_node, monkeypatch):
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)
    app_settings.update(zoekt_indexing_enabled=True, zoekt_search_enabled=True)
    gitlab = FakeGitLab(TOKEN)
    gitlab.add_group(100, "acme")
    gitlab.add_group(101, "tools", 100)
    gitlab.add_group(200, "other")
    for k in range(8):
        gitlab.add_project(1_000 + k, f"repo-{k}", 100 if k % 2 else 101)
    gitlab.add_project(2_000, "elsewhere", 200)
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

        plan = gitlab_plan(100)
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
        assert {pid for ids in gitlab_plan(100)["targets"].values() for pid in ids} == (
            acme - {1_003}
        )
