"""simulator.replay: the control plane and a fake fleet in one process on a simulated clock."""

from __future__ import annotations

import itertools

import pytest

from simulator.fakenode import GIB, MIB
from simulator.replay import BeatJob, InProcessTransport, Replay, catalog_rows, fleet_state
from zoekt import clock
from zoekt.models import EnabledNamespace, Index, Node

pytestmark = pytest.mark.django_db(transaction=True)

HOT, COLD, OTHER = 9100, 9200, 9300
SIZES = {HOT: 40 * MIB, COLD: 10 * MIB, OTHER: 20 * MIB}


def small_catalog():
    roots = {HOT: "hot", COLD: "cold", OTHER: "other"}
    projects = []
    for k, root in enumerate(roots):
        for j in range(3):
            projects.append((50_000 + 10 * k + j, root, SIZES[root]))
    return roots, projects


def make_replay(**kwargs) -> Replay:
    roots, projects = small_catalog()
    sizes = {project_id: size for project_id, _, size in projects}
    options = {
        "index_size": lambda repo_id: sizes[repo_id],
        "hotness": {HOT: 0.5, COLD: 0.1, OTHER: 0.2},
        "traffic": {HOT: 0.6, COLD: 0.1, OTHER: 0.3},
        "per_shard_base_bytes": MIB,
        **kwargs,
    }
    replay = Replay(**options)
    replay.catalog = (roots, projects)
    return replay


def start_fleet(replay: Replay, nodes=("zoekt-a", "zoekt-b"), **settings) -> None:
    roots, projects = replay.catalog
    replay.settings(zoekt_indexing_enabled=True, zoekt_search_enabled=True, **settings)
    replay.load_catalog(*catalog_rows(roots, projects))
    for name in nodes:
        replay.add_node(name, disk_total_bytes=10 * GIB, disk_base_used_bytes=GIB)
    replay.enable(list(roots))


def test_a_fleet_converges_on_the_simulated_clock_and_serves_every_search():
    with make_replay() as replay:
        start = clock.now()
        start_fleet(replay)
        assert replay.run(3600, until=lambda r: r.converged()) is True
        # The control plane saw simulated time, not wall time.
        assert (clock.now() - start).total_seconds() == pytest.approx(replay.t)
        assert 0 < replay.t < 3600
        state = fleet_state()
        assert state == {
            "namespaces": 3,
            "namespaces_short": 0,
            "indices": state["indices_ready"],
            "indices_ready": state["indices"],
        }
        assert EnabledNamespace.objects.count() == 3
        replay.run(300)
        # Once ready, no search is dark.
        late = [s for s in replay.samples if s.searches and s.t >= replay.t - 240]
        assert late and all(s.dark == 0 for s in late)
        assert sum(s.searches for s in late) == 100 * len(late)

        # Disk and memory follow what each node holds.
        held_by_node = {}
        for name, node in replay.nodes.items():
            held = node.fake.repos
            held_by_node[name] = held
            last = replay.samples[-1].nodes[name]
            assert last.disk_used_bytes == GIB + sum(repo.size_bytes for repo in held.values())
            assert last.shards_loaded == len(held)
        total = sum(len(held) for held in held_by_node.values())
        assert total == 9  # every project indexed once (one replica)
        factors = {HOT: 0.5, COLD: 0.1, OTHER: 0.2}
        expected_rss = {}
        for name, held in held_by_node.items():
            node_id = replay.nodes[name].fake.node_id
            roots_here = set(
                Index.objects.filter(zoekt_node_id=node_id).values_list("namespace_id", flat=True)
            )
            expected_rss[name] = len(held) * MIB + sum(
                int(SIZES[root] * 3 * factors[root]) for root in roots_here
            )
            assert replay.samples[-1].nodes[name].rss_bytes == pytest.approx(
                expected_rss[name], abs=8
            )


def test_the_disk_series_rises_as_indexing_proceeds():
    with make_replay(traffic={}) as replay:
        start_fleet(replay)
        replay.run(3600, until=lambda r: r.converged())
        totals = [sum(n.disk_used_bytes for n in s.nodes.values()) for s in replay.samples]
        assert totals[0] == 2 * GIB  # nothing indexed at the first tick
        assert totals[-1] == 2 * GIB + sum(3 * size for size in SIZES.values())
        assert all(b >= a for a, b in itertools.pairwise(totals))
        # No traffic asked for, none drawn.
        assert all(s.searches == 0 for s in replay.samples)


def test_beat_jobs_run_at_their_periods_in_simulated_time():
    with make_replay(traffic={}, tick_seconds=30) as replay:
        start_fleet(replay)
        replay.run(3600)
        runs = replay.job_runs
        assert runs["mark_indices_as_ready"] == 60  # every minute
        assert runs["lost_nodes_check"] == 6  # every 10 min
        assert runs["eviction"] == 12  # every 5 min
        assert runs["end_cooldowns"] == 12  # every 5 min, whatever node-level eviction
        assert runs["rollout"] == 6
        assert runs["refresh_buffer_factor"] == 1  # hourly, the first at 0
        # Restart records settle, and lost index data is noticed, every minute.
        assert runs["settle_node_shutdowns"] == runs["reindex_lost_index_data"] == 60


def test_a_lost_node_darkens_its_namespaces_until_it_is_replaced():
    with make_replay(searches_per_sample=200) as replay:
        start_fleet(replay, zoekt_lost_node_threshold="20m")
        replay.run(3600, until=lambda r: r.converged())
        replay.run(300)
        # Stop the node that holds the hot namespace.
        hot_node_id = Index.objects.get(namespace_id=HOT).zoekt_node_id
        victim = next(n for n, node in replay.nodes.items() if node.fake.node_id == hot_node_id)
        stopped_at = replay.t
        replay.stop_node(victim)
        replay.run(600)
        dark_now = [s for s in replay.samples if s.t > stopped_at + 60 and s.searches]
        assert dark_now and all(s.dark > 0 for s in dark_now)
        assert Node.objects.filter(id=hot_node_id).exists()  # offline, not yet lost

        gone = replay.run(
            3 * 3600,
            until=lambda r: not Node.objects.filter(id=hot_node_id).exists() and r.converged(),
        )
        assert gone is True
        assert replay.t - stopped_at >= 20 * 60  # not before the threshold
        replay.run(300)
        after = [s for s in replay.samples if s.t > replay.t - 240 and s.searches]
        assert after and all(s.dark == 0 for s in after)
        assert set(Index.objects.values_list("zoekt_node_id", flat=True)) == {
            node.fake.node_id for node in replay.nodes.values() if node.alive
        }
        # The stopped node's series ends at the stop.
        assert replay.samples[-1].nodes[victim].alive is False
        assert replay.events[-1] == (stopped_at, f"{victim} stopped")


def test_the_replay_restores_the_clock_and_celery_on_exit():
    from config.celery import app as celery_app

    before = celery_app.conf.task_always_eager
    with make_replay() as replay:
        assert celery_app.conf.task_always_eager is True
        replay.run(60)
        assert clock.now() > replay.start
    assert celery_app.conf.task_always_eager == before
    assert abs((clock.now() - replay.start).total_seconds()) > 3600  # real time again


def test_the_in_process_transport_returns_refusals_as_a_node_would_see_them():
    transport = InProcessTransport()
    status, body = transport.post_json(
        "/api/v4/internal/search/zoekt/4b3cdb9e-0a6e-4f6c-9a0e-8d7f6c5b4a39/heartbeat",
        {},
        {"Gitlab-Shell-Api-Request": "not-a-token"},
    )
    assert status == 401
    assert isinstance(body, dict) and body


def test_a_job_is_due_first_at_zero_then_each_period():
    job = BeatJob("x", 60, lambda: None)
    assert job.due(0)
    job.last = 0
    assert not job.due(59)
    assert job.due(60)


def test_with_an_indexing_rate_indexing_takes_simulated_time():
    rate = 100 * 1024  # bytes a second per task
    with make_replay(traffic={}, indexing_bytes_per_second=rate, node_concurrency=1) as replay:
        start_fleet(replay)
        assert replay.run(4 * 3600, until=lambda r: r.converged()) is True
        # One task at a time per node: a node holding B bytes indexed for at least B / rate.
        busiest = 0
        for name, node in replay.nodes.items():
            held = sum(repo.size_bytes for repo in node.fake.repos.values())
            if not held:
                continue
            busiest = max(busiest, held)
            disk = [(s.t, s.nodes[name].disk_used_bytes) for s in replay.samples]
            first = next(t for t, used in disk if used > GIB)
            full = next(t for t, used in disk if used == GIB + held)
            # From the end of the first task to the end of the last: the others, one by one.
            assert full - first >= (held - max(SIZES.values())) / rate - replay.tick_seconds
        assert busiest and replay.t >= busiest / rate


def test_a_rollout_that_re_enqueues_itself_runs_again_in_the_same_tick():
    with make_replay(traffic={}) as replay:
        start_fleet(replay, zoekt_rollout_batch_size=1)
        replay.run(replay.tick_seconds)  # one tick: the rollout's first run
        assert replay.job_runs["rollout"] == 1
        assert EnabledNamespace.objects.filter(replicas__isnull=False).distinct().count() == 3


def test_a_watcher_reads_the_fleet_at_the_instant_searches_are_drawn():
    from zoekt.search_targets import search_targets_many

    seen = []
    with make_replay(tick_seconds=30.0) as replay:
        start_fleet(replay)

        def watcher(r):
            seen.append((r.t, clock.now(), search_targets_many([HOT])[HOT].targets))

        replay.watch(watcher)
        assert replay.run(3600, until=lambda r: r.converged())
        replay.run(120)
        # Called once a tick, before the clock moved on: the time it sees is the tick's.
        assert len(seen) == len(replay.samples)
        assert [t for t, _, _ in seen] == [s.t for s in replay.samples]
        t, now, targets = seen[-1]
        assert (now - replay.start).total_seconds() == pytest.approx(t)
        assert targets and not replay.samples[-1].dark
        # One tick (30 s) later, with no heartbeat in between, the nodes are offline.
        assert search_targets_many([HOT])[HOT].targets == ()
