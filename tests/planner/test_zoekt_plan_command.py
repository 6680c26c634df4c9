"""``manage.py zoekt_plan``: what the next rollout would do, and why; or a rollout now."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.cache import cache
from django.core.management import CommandError, call_command

from planner import selection
from planner.apply import ProvisioningService
from planner.core import plan_dict
from planner.loader import load_scenario
from planner.management.commands.zoekt_plan import _with_names
from planner.rollout import PLAN_LOG_KEY
from planner.selection import SelectionService
from tests.factories import (
    EnabledNamespaceFactory,
    GroupFactory,
    IndexFactory,
    NodeFactory,
    ProjectFactory,
    ReplicaFactory,
)
from tests.locking import session_lock_held_elsewhere
from zoekt import app_settings, buffer_factor
from zoekt.locks import LockKey
from zoekt.models import EnabledNamespace, Index, Node, Replica

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


set_setting = app_settings.update


def node(unclaimed: int, name: str, **kwargs) -> Node:
    return NodeFactory(
        total_bytes=unclaimed, used_bytes=0, indexed_bytes=0, metadata={"name": name}, **kwargs
    )


def enabled_group(*sizes: int | None, **kwargs) -> EnabledNamespace:
    group = GroupFactory()
    namespace = EnabledNamespaceFactory(root_namespace=group, **kwargs)
    for size in sizes:
        ProjectFactory(namespace=group, repository_size=size)
    return namespace


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("zoekt_plan", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def fleet(now):
    """Two candidates and an offline node; the second namespace no longer fits the first node."""
    first = node(1000, "zoekt-a")
    second = node(900, "zoekt-b")
    offline = node(5000, "zoekt-gone", last_seen_at=now - timedelta(minutes=5))
    ns1 = enabled_group(200)  # 600 bytes: zoekt-a, leaving 400
    ns2 = enabled_group(150)  # 450 bytes: zoekt-a has 400, so zoekt-b
    return {"a": first, "b": second, "offline": offline, "ns1": ns1, "ns2": ns2}


def test_the_report_explains_each_namespace_and_each_node(fleet):
    out, _ = run()
    a, b = fleet["a"], fleet["b"]
    ns1, ns2 = fleet["ns1"], fleet["ns2"]
    assert "Next rollout (preview: nothing is written): batch size 32, buffer factor 3" in out
    assert "Namespaces: 2 selected; create 2, destroy 0, unchanged 0, failures 0" in out
    # Per namespace: which node each index took and why earlier candidates were passed over.
    assert f"namespace {ns1.root_namespace_id} (enabled namespace {ns1.id}): create, ok" in out
    assert f"namespace {ns2.root_namespace_id} (enabled namespace {ns2.id}): create, ok" in out
    assert (
        f"    node {a.id} (zoekt-a) passed over: insufficient unclaimed storage "
        "(requested 450, available 400 bytes)"
    ) in out
    assert (
        f"planned replica 0 index 0: node {b.id} (zoekt-b), all projects, reserves 450 bytes"
    ) in out
    # Per node, in candidate order, with what it was taken for and why it was passed over.
    assert f"#1 node {a.id} (zoekt-a): unclaimed 1,000 bytes → 400 bytes" in out
    assert f"#2 node {b.id} (zoekt-b): unclaimed 900 bytes → 450 bytes" in out
    assert "taken for 1 index(es); passed over 1× insufficient unclaimed storage" in out
    assert f"node {fleet['offline'].id} (zoekt-gone): offline" in out
    assert not Replica.objects.exists()


def test_json_prints_the_plan_the_planner_makes_of_the_loaded_scenario(fleet):
    out, _ = run("--json")
    expected = plan_dict(load_scenario(SelectionService(32).execute()))
    assert json.loads(out) == expected
    assert [ns["namespace_id"] for ns in expected["create"]] == [
        fleet["ns1"].root_namespace_id,
        fleet["ns2"].root_namespace_id,
    ]
    assert not Replica.objects.exists() and not Index.objects.exists()


@pytest.mark.parametrize("factor", [None, 2.7182818], ids=["integral-factor", "fractional-factor"])
def test_an_exported_scenario_replays_to_the_same_plan(fleet, tmp_path, factor):
    if factor is not None:
        cache.set(buffer_factor.CACHE_KEY, {"value": factor}, 60)
    scenario_file = tmp_path / "scenario.json"
    out, err = run("--json", "--export-scenario", str(scenario_file))
    assert f"scenario written to {scenario_file}" in err
    exported = json.loads(scenario_file.read_text())
    assert exported["options"]["buffer_factor"] == (factor or 3)
    assert [n["id"] for n in exported["nodes"]] == [fleet["a"].id, fleet["b"].id]

    replay = subprocess.run(
        [sys.executable, "-m", "planner", "plan", "--input", str(scenario_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout == out


def test_the_batch_size_option_limits_the_namespaces(fleet):
    out, _ = run("--json", "--batch-size", "1")
    plan = json.loads(out)
    assert [ns["namespace_id"] for ns in plan["create"]] == [fleet["ns1"].root_namespace_id]


def test_the_preview_counts_index_less_replicas_the_run_would_remove_and_keeps_them(fleet):
    emptied = EnabledNamespaceFactory()
    orphan = ReplicaFactory(zoekt_enabled_namespace=emptied)
    out, _ = run()
    assert "Replicas without indices to remove first: 1" in out
    assert f"namespace {emptied.root_namespace_id} (enabled namespace {emptied.id}): create" in out
    assert Replica.objects.filter(pk=orphan.pk).exists()


def test_nothing_to_do_says_so(now):
    node(1000, "zoekt-a")
    out, _ = run()
    assert "No enabled namespaces found: the rollout stops here." in out
    out, err = run("--json")
    assert json.loads(out)["create"] == []
    assert "No enabled namespaces found" in err


def test_no_candidate_node_says_the_rollout_stops(now):
    node(1000, "zoekt-full", services=[])
    enabled_group(10)
    out, _ = run()
    assert "No available nodes found: the rollout stops here." in out
    assert "not a search node" in out


def test_apply_runs_a_rollout_now(fleet, caplog):
    caplog.set_level(logging.INFO)
    set_setting(zoekt_indexing_enabled=True)
    out, _ = run("--apply")
    assert "Rollout run: batch size 32" in out
    assert "Result: Batch is completed with success" in out
    for namespace in (fleet["ns1"], fleet["ns2"]):
        replica = Replica.objects.get(zoekt_enabled_namespace=namespace)
        assert f"namespace {namespace.root_namespace_id}: replica {replica.id} created" in out
    assert Index.objects.count() == 2
    logged = [r.msg for r in caplog.records if isinstance(r.msg, dict) and PLAN_LOG_KEY in r.msg]
    assert len(logged) == 1


def test_apply_with_json_prints_the_applied_plan(fleet):
    set_setting(zoekt_indexing_enabled=True)
    out, err = run("--apply", "--json")
    assert len(json.loads(out)["create"]) == 2
    assert "Batch is completed with success" in err
    assert Replica.objects.count() == 2


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        pytest.param({}, "indexing_disabled", id="indexing-disabled"),
        pytest.param(
            {"zoekt_indexing_enabled": True, "zoekt_indexing_paused": True},
            "indexing_paused",
            id="indexing-paused",
        ),
    ],
)
def test_apply_refuses_unless_indexing_runs(fleet, settings, reason):
    if settings:
        set_setting(**settings)
    with pytest.raises(CommandError, match=reason):
        run("--apply")
    assert not Replica.objects.exists()


def test_apply_refuses_while_another_rollout_runs(fleet):
    set_setting(zoekt_indexing_enabled=True)
    held = session_lock_held_elsewhere(LockKey.ROLLOUT)
    with held, pytest.raises(CommandError, match="lock_held"):
        run("--apply")
    assert not Replica.objects.exists()


def test_long_explanations_are_capped(now):
    node(1000, "zoekt-a")
    for _ in range(3):
        node(10, "zoekt-small")
    namespace = enabled_group(1000, 1000, 1000, 1000)  # no node takes 3,000 bytes
    out, _ = run("--max-decisions", "2")
    assert f"namespace {namespace.root_namespace_id}" in out
    assert "(showing 2 of 4 decisions and at most 2 passed-over nodes each" in out
    out, _ = run("--max-decisions", "0")
    assert "showing" not in out
    assert out.count("passed over: insufficient unclaimed storage (requested 3,000") == 16


def test_long_loads_show_progress_on_stderr(fleet):
    _, err = run("-v", "2")
    assert "loaded 2/2 namespaces (2 projects)" in err
    assert "phases: cleanup" in err
    _, quiet = run("-v", "0")
    assert "loaded" not in quiet


def test_a_bad_batch_size_is_refused(now):
    with pytest.raises(CommandError, match="batch-size"):
        run("--batch-size", "0")


def test_node_names_stand_next_to_node_ids(fleet):
    a, b = fleet["a"], fleet["b"]
    out, _ = run()
    # planner.explain's lines, the planned indices and the per-node section all name the node.
    assert f"node {a.id} (zoekt-a) for project" in out
    assert f"node {b.id} (zoekt-b) for project" in out
    assert f"    node {a.id} (zoekt-a): took index 0 of replica 0" in out
    assert f"planned replica 0 index 0: node {a.id} (zoekt-a), all projects" in out
    assert f"#1 node {a.id} (zoekt-a)" in out
    # No node id stands without its name.
    named = {a.id, b.id, fleet["offline"].id}
    for line in out.splitlines():
        for word in line.replace(",", " ").replace(":", " ").split("node ")[1:]:
            node_id = word.split()[0]
            if node_id.isdigit() and int(node_id) in named:
                assert word.split()[1].startswith("("), line


def test_an_unnamed_node_is_shown_by_its_id_alone(now):
    plain = NodeFactory(total_bytes=1000, used_bytes=0, indexed_bytes=0, metadata={})
    enabled_group(10)
    out, _ = run()
    assert f"planned replica 0 index 0: node {plain.id}, all projects" in out
    assert f"#1 node {plain.id} (node-{plain.id})" in out


def test_apply_errors_name_the_node(fleet, monkeypatch):
    set_setting(zoekt_indexing_enabled=True)
    a = fleet["a"]
    real_execute = ProvisioningService.execute

    def shrink_then_execute(self):
        Node.objects.filter(pk=a.pk).update(usable_storage_bytes=100)  # after planning
        return real_execute(self)

    monkeypatch.setattr(ProvisioningService, "execute", shrink_then_execute)
    out, _ = run("--apply")
    root = fleet["ns1"].root_namespace_id
    assert "Result: Batch is completed with partial success" in out
    assert (
        f"  namespace {root} replica 0 on node {a.id} (zoekt-a): node_capacity_exceeded: "
        f"Node {a.id} (zoekt-a) has 100 unclaimed bytes; the index needs 600"
    ) in out
    assert f"  marked rollout-failed: {root}" in out


def test_namespaces_over_gitlabs_project_limit_are_named_with_the_reason(fleet, monkeypatch):
    monkeypatch.setattr(selection, "MAX_PROJECTS_PER_NAMESPACE", 1)
    big = enabled_group(1, 1)
    out, _ = run()
    assert "Skipped (not planned): 1 namespace(s)" in out
    assert (
        f"  namespace {big.root_namespace_id} (enabled namespace {big.id}): more than 1 "
        "project namespaces, GitLab's limit for a rollout (too_many_project_namespaces)"
    ) in out
    assert "Namespaces: 2 selected" in out
    _, err = run("--json")
    assert (
        f"skipped namespace {big.root_namespace_id} (enabled namespace {big.id}): more than 1 "
        "project namespaces, GitLab's limit for a rollout (too_many_project_namespaces)"
    ) in err


def test_a_batch_of_only_skipped_namespaces_says_why_nothing_is_planned(now, monkeypatch):
    monkeypatch.setattr(selection, "MAX_PROJECTS_PER_NAMESPACE", 1)
    node(1000, "zoekt-a")
    big = enabled_group(1, 1)
    out, _ = run()
    assert "No enabled namespace can be planned now (1 enabled): the rollout stops here." in out
    assert "No enabled namespaces found" not in out
    assert (
        f"  namespace {big.root_namespace_id} (enabled namespace {big.id}): more than 1 "
        "project namespaces"
    ) in out


def test_a_namespace_whose_projects_all_lack_statistics_is_named_as_waiting(fleet):
    waiting = enabled_group(None, None)
    expected = (
        f"namespace {waiting.root_namespace_id} (enabled namespace {waiting.id}): none of its "
        "projects has statistics yet (2 project namespaces); it waits for them and takes no "
        "place in the batch (waiting_for_project_statistics)"
    )

    out, _ = run()

    assert "Skipped (not planned): 1 namespace(s)" in out
    assert f"  {expected}" in out
    assert "Namespaces: 2 selected" in out  # the two ordinary ones are planned
    _, err = run("--json")
    assert f"skipped {expected}" in err


def test_a_fleet_whose_only_work_waits_for_statistics_says_why_nothing_is_planned(now):
    node(1000, "zoekt-a")
    waiting = enabled_group(None)
    out, _ = run()
    assert "No enabled namespace can be planned now (1 enabled): the rollout stops here." in out
    assert (
        f"  namespace {waiting.root_namespace_id} (enabled namespace {waiting.id}): none of its "
        "projects has statistics yet"
    ) in out


def test_dry_run_is_accepted_and_is_the_preview(fleet):
    preview, _ = run()
    out, _ = run("--dry-run")
    assert out == preview
    assert "Next rollout (preview: nothing is written)" in out
    out, _ = run("--dry-run", "--json")
    assert len(json.loads(out)["create"]) == 2
    assert not Replica.objects.exists()
    with pytest.raises(CommandError, match="not allowed with argument"):
        run("--dry-run", "--apply")
    assert not Replica.objects.exists()


def converged(count: int) -> list[EnabledNamespace]:
    """``count`` enabled namespaces, each with its one replica and that replica's index."""
    holder = node(10_000, "zoekt-a")
    namespaces = []
    for _ in range(count):
        namespace = enabled_group(10)
        replica = ReplicaFactory(zoekt_enabled_namespace=namespace)
        IndexFactory(zoekt_replica=replica, zoekt_node=holder, reserved_storage_bytes=30)
        namespaces.append(namespace)
    return namespaces


def test_a_converged_fleet_says_no_namespace_needs_work(now):
    converged(3)
    out, _ = run()
    assert "No enabled namespace needs work (3 enabled): the rollout stops here." in out
    assert "Each has as many replicas as it should: none to create or remove." in out
    assert "No enabled namespaces found" not in out
    _, err = run("--json")
    assert "No enabled namespace needs work (3 enabled)" in err
    assert "No enabled namespaces found" not in err


def test_namespaces_waiting_for_their_retry_are_counted(now):
    converged(2)
    failed = enabled_group(10)
    EnabledNamespace.objects.filter(pk=failed.pk).update(last_rollout_failed_at=now)
    out, _ = run()
    assert "No enabled namespace can be planned now (3 enabled): the rollout stops here." in out
    assert (
        "1 namespace(s) that need replicas created or removed wait to be retried after a "
        "failed rollout (zoekt_rollout_retry_interval)."
    ) in out


def test_the_buffer_factor_is_rounded_in_the_report_and_exact_in_the_scenario(fleet, tmp_path):
    cache.set(buffer_factor.CACHE_KEY, {"value": 2.7182818}, 60)
    scenario_file = tmp_path / "scenario.json"
    out, _ = run("--export-scenario", str(scenario_file))
    assert "batch size 32, buffer factor 2.72, placement balanced\n" in out
    assert "2.7182818" not in out
    assert json.loads(scenario_file.read_text())["options"]["buffer_factor"] == 2.7182818
    cache.set(buffer_factor.CACHE_KEY, {"value": 2.5}, 60)
    assert "buffer factor 2.5, placement balanced\n" in run()[0]


def test_memory_warnings_name_the_nodes_they_speak_of(now):
    # Budget 4,000 bytes: an index may hold 1,000 bytes of estimated memory (two projects);
    # five projects on two nodes leave the fifth past the ceiling, with a warning.
    set_setting(zoekt_node_memory_budget_bytes=4_000)
    first = node(10**9, "zoekt-a")
    second = node(10**9 - 1, "zoekt-b")
    enabled_group(*[1_000] * 5)
    out, _ = run()
    (warning,) = [line for line in out.splitlines() if "warning memory_node_exhausted" in line]
    assert f"index 1 on node {second.id} (zoekt-b) reached its max_memory_bytes" in warning
    assert (
        f"Over max_memory_bytes: index 1 on node {second.id} (zoekt-b) (1500 bytes estimated"
    ) in warning
    assert f"node {first.id} (zoekt-a)" in out
    assert "(zoekt-b) (zoekt-b)" not in out


def test_a_capitalised_node_id_is_named_too():
    names = {7: "zoekt-a", 8: "zoekt-b"}
    assert _with_names("Node 7 has 5 bytes; node 8 (zoekt-b) too; node 9", names) == (
        "Node 7 (zoekt-a) has 5 bytes; node 8 (zoekt-b) too; node 9"
    )


def test_a_node_in_eviction_cooldown_is_named_with_the_reason_and_until_when(fleet, now):
    cooling = node(10_000, "zoekt-cooling", eviction_cooldown_until=now + timedelta(hours=3))
    out, _ = run()
    # It would be the roomiest candidate; it is not one.
    assert f"#1 node {fleet['a'].id} (zoekt-a)" in out
    assert f"#1 node {cooling.id}" not in out and "#3 node" not in out
    (line,) = [row for row in out.splitlines() if f"node {cooling.id} (zoekt-cooling):" in row]
    assert line == (
        f"  node {cooling.id} (zoekt-cooling): in its eviction cooldown until "
        "2026-03-01 15:00:00 UTC (3:00 h left; node_eviction_cooldown)"
    )
    plan_out, err = run("--json")
    assert cooling.id not in {n["id"] for n in json.loads(plan_out)["nodes"]}
    assert (
        f"not a candidate: node {cooling.id} (zoekt-cooling): in its eviction cooldown until "
        "2026-03-01 15:00:00 UTC (3:00 h left; node_eviction_cooldown)"
    ) in err


def test_a_fleet_all_in_cooldown_stops_and_says_why(now):
    cooling = node(10_000, "zoekt-cooling", eviction_cooldown_until=now + timedelta(minutes=90))
    enabled_group(10)
    out, _ = run()
    assert "No available nodes found: the rollout stops here." in out
    assert (
        f"  node {cooling.id} (zoekt-cooling): in its eviction cooldown until "
        "2026-03-01 13:30:00 UTC (1:30 h left; node_eviction_cooldown)"
    ) in out


def test_an_ended_cooldown_is_no_reason(now):
    ended = node(10_000, "zoekt-cooled", eviction_cooldown_until=now - timedelta(minutes=1))
    enabled_group(10)
    out, _ = run()
    assert f"#1 node {ended.id} (zoekt-cooled)" in out
    assert "eviction cooldown" not in out


def test_a_node_being_restarted_is_no_candidate_and_is_named_with_the_reason(fleet, now):
    from zoekt import shutdowns

    restarting = node(10_000, "zoekt-restarting")
    shutdowns.do_request_node_shutdown(
        restarting.id, type="restart", reason="upgrade", requested_by="ops"
    )
    out, _ = run()
    # It would be the roomiest candidate; it is not one.
    assert f"#1 node {fleet['a'].id} (zoekt-a)" in out
    (line,) = [
        row for row in out.splitlines() if f"node {restarting.id} (zoekt-restarting):" in row
    ]
    assert line == (
        f"  node {restarting.id} (zoekt-restarting): being restarted "
        "(docs/operations.md; node_in_restart)"
    )
