"""zoekt_demo_incident: the fake node's override file, and what each incident writes."""

from __future__ import annotations

import json
import time

import pytest
from django.core.management import CommandError, call_command

from eviction.models import EvictionDecision
from simulator import demoincidents
from simulator.demoincidents import (
    Drain,
    Overfill,
    SettingsChange,
    Spike,
    fill_bytes,
    make_incident,
)
from simulator.fakenode import NodeOverride, override_path, write_override
from simulator.models import NamespaceMemoryModel
from tests.factories import IndexFactory, NodeFactory, ProjectFactory
from tests.simulator.fakenode_stub import index_task, reply
from zoekt import app_settings
from zoekt.models import Index, NodeShutdown

GIB = 1024**3


# --- the fake node reads its override file on every heartbeat ------------------------------------


def test_a_node_reports_the_extra_disk_of_its_override_until_it_clears(make_node, tmp_path):
    node = make_node(name="zoekt-o", disk_total_bytes=100 * GIB, disk_base_used_bytes=10 * GIB)
    assert node.heartbeat_body()["disk.used"] == 10 * GIB
    path = override_path(tmp_path, "zoekt-o")
    write_override(path, NodeOverride(extra_disk_bytes=70 * GIB, until=time.time() + 60))
    assert node.heartbeat_body()["disk.used"] == 80 * GIB
    # A spike's end is a wall-clock time: past it the node reports its own disk again.
    write_override(path, NodeOverride(extra_disk_bytes=70 * GIB, until=time.time() - 1))
    assert node.heartbeat_body()["disk.used"] == 10 * GIB
    write_override(path, NodeOverride(extra_disk_bytes=5 * GIB))
    assert node.heartbeat_body()["disk.used"] == 15 * GIB
    write_override(path, None)
    assert not path.exists()
    assert node.heartbeat_body()["disk.used"] == 10 * GIB


def test_extra_memory_counts_only_while_the_node_holds_the_namespace(make_node, stub, tmp_path):
    memory = NamespaceMemoryModel(per_shard_base_bytes=1000, hotness={9: 0.5})
    node = make_node(name="zoekt-h", namespace_memory=memory, index_size=lambda _repo: 4_000_000)
    write_override(override_path(tmp_path, "zoekt-h"), NodeOverride(extra_rss_bytes={9: 10**9}))

    def rss() -> int:
        return node.heartbeat_body()["process_health"]["webserver"]["rss_bytes"]

    assert rss() == 0  # holds nothing of namespace 9 yet
    stub.replies = [reply(index_task(1, 10, Metadata={"traversal_ids": "9-"}))]
    node.step()
    assert rss() == 1000 + 4_000_000 * 0.5 + 10**9


def test_an_override_file_that_does_not_parse_changes_nothing(make_node, tmp_path):
    logged = []
    node = make_node(
        name="zoekt-b", disk_base_used_bytes=10 * GIB, disk_total_bytes=100 * GIB, log=logged.append
    )
    override_path(tmp_path, "zoekt-b").write_text('{"extra_disk_bytes": -5}')
    assert node.heartbeat_body()["disk.used"] == 10 * GIB
    assert [r["error"] for r in logged if r["event"] == "override_ignored"] == [
        "extra_disk_bytes must be a whole number >= 0"
    ]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([], "JSON object"),
        ({"extra_disk_bytes": True}, "extra_disk_bytes"),
        ({"until": "soon"}, "until"),
        ({"extra_rss_bytes": [1]}, "extra_rss_bytes"),
        ({"extra_rss_bytes": {"9": -1}}, "extra_rss_bytes['9']"),
        ({"extra_rss_bytes": {"x": 1}}, "'x' is not a namespace id"),
    ],
)
def test_a_bad_override_names_what_is_wrong(raw, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        NodeOverride.from_json(raw)


def test_an_override_round_trips_through_its_file(tmp_path):
    value = NodeOverride(extra_disk_bytes=3, until=12.5, extra_rss_bytes={7: 9}, note="x")
    path = tmp_path / "n.override.json"
    write_override(path, value)
    assert NodeOverride.from_json(json.loads(path.read_text())) == value


def test_fill_bytes():
    assert fill_bytes(5 * GIB, 25 * GIB, 0.80) == 15 * GIB
    assert fill_bytes(24 * GIB, 25 * GIB, 0.80) == 0


# --- the command's arguments -------------------------------------------------------------------


def test_an_unknown_incident_is_refused():
    with pytest.raises(CommandError, match="invalid choice: 'flood'"):
        call_command("zoekt_demo_incident", "flood")


def test_namespace_is_for_the_hot_incident_only():
    with pytest.raises(CommandError, match="--namespace is for the hot incident only"):
        call_command("zoekt_demo_incident", "spike", "--namespace", "9")


@pytest.mark.django_db
def test_an_unknown_node_or_an_empty_fleet_starts_nothing(tmp_path):
    with pytest.raises(CommandError, match="no node 'zoekt-9'"):
        call_command("zoekt_demo_incident", "drain", "--node", "zoekt-9")
    with pytest.raises(CommandError, match="no search node is online"):
        call_command("zoekt_demo_incident", "overfill", "--state-dir", str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    assert not app_settings.current().node_level_eviction_enabled


# --- what each incident writes -----------------------------------------------------------------


@pytest.mark.django_db
def test_settings_are_changed_for_the_incident_and_put_back():
    change = SettingsChange(
        {"zoekt_node_level_eviction_enabled": True, "zoekt_eviction_sustain_period": "1m"}
    )
    assert change.apply() == [
        "zoekt_node_level_eviction_enabled: False -> True",
        "zoekt_eviction_sustain_period: '8h' -> '1m'",
    ]
    current = app_settings.current()
    assert current.node_level_eviction_enabled and current.eviction_sustain_seconds == 60
    assert change.restore() == [
        "zoekt_node_level_eviction_enabled: back to False",
        "zoekt_eviction_sustain_period: back to '8h'",
    ]
    current = app_settings.current()
    assert not current.node_level_eviction_enabled
    assert current.eviction_sustain_seconds == 8 * 3600


@pytest.mark.django_db
def test_a_spike_fills_the_picked_node_for_a_while_then_everything_is_put_back(tmp_path):
    busy = NodeFactory(total_bytes=25 * GIB, used_bytes=5 * GIB, metadata={"name": "zoekt-a"})
    quiet = NodeFactory(total_bytes=25 * GIB, used_bytes=4 * GIB, metadata={"name": "zoekt-b"})
    for _ in range(2):
        IndexFactory(zoekt_node=busy, state=Index.State.READY)
    IndexFactory(zoekt_node=quiet, state=Index.State.READY)

    incident = make_incident("spike", tmp_path)
    assert isinstance(incident, Spike) and incident.node == quiet  # the fewest indices
    lines = incident.begin()
    assert "  zoekt_eviction_sustain_period: '8h' -> '2m'" in lines
    written = NodeOverride.from_json(json.loads((tmp_path / "zoekt-b.override.json").read_text()))
    assert written.extra_disk_bytes == 16 * GIB  # 4 GiB used + 16 = 80 % of 25 GiB
    assert written.until == pytest.approx(time.time() + demoincidents.SPIKE_SECONDS, abs=5)
    assert app_settings.current().node_level_eviction_enabled

    over, line = incident.check({})
    assert not over and line.startswith("zoekt-b disk 16%; decisions: no decision yet")
    incident.finish()
    assert not (tmp_path / "zoekt-b.override.json").exists()
    assert not app_settings.current().node_level_eviction_enabled


@pytest.mark.django_db
def test_an_overfill_is_over_once_its_decision_moved_everything_it_chose(tmp_path, now):
    node = NodeFactory(total_bytes=25 * GIB, used_bytes=5 * GIB, metadata={"name": "zoekt-f"})
    IndexFactory.create_batch(2, zoekt_node=node, state=Index.State.READY)
    IndexFactory(zoekt_node=NodeFactory(metadata={"name": "zoekt-g"}), state=Index.State.READY)
    incident = make_incident("overfill", tmp_path)
    assert isinstance(incident, Overfill)
    assert incident.node == node  # the most indices: the most to move
    incident.begin()
    written = NodeOverride.from_json(json.loads((tmp_path / "zoekt-f.override.json").read_text()))
    assert (written.extra_disk_bytes, written.until) == (int(0.78 * 25 * GIB) - 5 * GIB, None)
    # The sustain period not reached yet: a skipped decision, not over.
    EvictionDecision.objects.create(
        node=node, trigger="node_level", mode="safeguards", reason="eviction_sustain_not_reached"
    )
    over, line = incident.check({})
    assert not over and "decisions: eviction_sustain_not_reached ×1; moves: none" in line
    incident.finish()
    assert app_settings.load_row().zoekt_memory_ratio == 0.5


@pytest.mark.django_db
def test_a_drain_requests_the_remove_and_cancels_it_when_it_ends_early(tmp_path):
    node = NodeFactory(metadata={"name": "zoekt-d"})
    IndexFactory(zoekt_node=node, state=Index.State.READY)
    incident = make_incident("drain", tmp_path, node_ref="zoekt-d")
    assert isinstance(incident, Drain)
    lines = incident.begin()
    assert "zoekt-d: drain requested (zoekt_node remove zoekt-d), 1 indices to move off it" in lines
    record = NodeShutdown.objects.get(node_ref=node.id)
    assert (record.type, record.status) == ("remove", "in_progress")
    lines = incident.finish()
    record.refresh_from_db()
    assert record.status == "cancelled"
    assert lines[-1].startswith("zoekt-d: drain cancelled")


@pytest.mark.django_db
def test_a_hot_namespace_grows_on_the_busiest_node_over_the_ramp(tmp_path, monkeypatch):
    def health(rss: int) -> dict:
        webserver = {"rss_bytes": rss, "memory_limit_bytes": 2 * GIB}
        return {"version": "v1.16.2", "process_health": {"webserver": webserver}}

    cool = NodeFactory(metadata={"name": "zoekt-c", **health(GIB // 2)})
    hot = NodeFactory(metadata={"name": "zoekt-h", **health(GIB)})
    # The memory-pressure rule ranks by estimate (repository bytes), not by index bytes:
    # the namespace that grows is the one it would move first.
    small = IndexFactory(zoekt_node=hot, state=Index.State.READY, used_storage_bytes=10**9)
    big = IndexFactory(zoekt_node=hot, state=Index.State.READY, used_storage_bytes=10)
    for index, size in ((small, 2**20), (big, 2 * GIB)):
        ProjectFactory(namespace=index.zoekt_enabled_namespace.root_namespace, repository_size=size)
    IndexFactory(zoekt_node=cool, state=Index.State.READY, used_storage_bytes=10**10)
    incident = make_incident("hot", tmp_path)
    assert incident.node == hot  # the highest share of its memory budget
    clock = {"now": 1000.0}
    monkeypatch.setattr(demoincidents.time, "time", lambda: clock["now"])
    lines = incident.begin()
    namespace = big.zoekt_enabled_namespace.root_namespace_id
    assert namespace != small.zoekt_enabled_namespace.root_namespace_id
    assert (
        f"zoekt-h: webserver RSS 1.00 GiB of 2.00 GiB (50%); namespace {namespace}'s resident "
        "memory grows by 0.60 GiB over 20 s, to 80%"
    ) in lines
    assert app_settings.current().memory_pressure_moves

    def grown() -> int:
        raw = json.loads((tmp_path / "zoekt-h.override.json").read_text())
        return NodeOverride.from_json(raw).extra_rss_bytes[namespace]

    clock["now"] += demoincidents.HOT_RAMP_SECONDS / 2
    assert incident.check({})[0] is False
    extra = int(0.8 * 2 * GIB) - GIB
    assert grown() == extra // 2  # half the ramp, half the growth
    clock["now"] += demoincidents.HOT_RAMP_SECONDS
    incident.check({})
    assert grown() == extra  # the ramp is over: 80 % of the budget
    incident.finish()
    assert not (tmp_path / "zoekt-h.override.json").exists()
    assert not app_settings.current().memory_pressure_moves


# --- end to end: the override file read by fake nodes, the real jobs on a simulated clock ------


@pytest.mark.django_db(transaction=True)
def test_an_overfill_through_the_override_file_moves_the_node_off_without_a_dark_tick():
    from simulator.replay import catalog_rows
    from tests.simulator.test_replay import HOT, make_replay
    from zoekt.models import Move, Node

    with make_replay(tick_seconds=30.0) as replay:
        roots, projects = replay.catalog
        replay.settings(zoekt_indexing_enabled=True, zoekt_search_enabled=True)
        replay.load_catalog(*catalog_rows(roots, projects))
        for name in ("zoekt-a", "zoekt-b", "zoekt-c"):
            replay.add_node(name, disk_total_bytes=10 * GIB, disk_base_used_bytes=GIB)
        replay.enable(list(roots))
        assert replay.run(3600, until=lambda r: r.converged())
        source = Node.objects.get(pk=Index.objects.get(namespace_id=HOT).zoekt_node_id)
        leaving = set(
            Index.objects.filter(zoekt_node=source).values_list("namespace_id", flat=True)
        )

        incident = make_incident("overfill", replay._state_dir, node_ref=source.name)
        incident.begin()
        assert replay.run(3600, until=lambda r: incident.check({})[0])
        created = Move.objects.order_by("created_at").first().created_at
        first_move = (created - replay.start).total_seconds()  # replay time
        incident.finish()

    moves = list(Move.objects.all())
    assert {m.namespace_id for m in moves} == leaving
    assert all(m.state == Move.State.DONE and m.target_node_id != source.id for m in moves)
    # Swapped: what is left on the node is evicted, waiting for its deletion.
    assert not Index.objects.filter(zoekt_node=source, state=Index.State.READY).exists()
    # From the decision to the last swap, no search found no target.
    after = [s for s in replay.samples if s.t >= first_move and s.searches]
    assert after and not any(s.dark for s in after)
    assert not app_settings.current().node_level_eviction_enabled
