"""Search health: which nodes a search may go to (GitLab's ProcessHealth and Node.searchable).

The rule is checked as pure functions over a node's metadata and its
``webserver_last_seen_at`` column first, at and around each threshold, then
through ``Node.objects.searchable``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from tests.conftest import NOW
from tests.factories import NodeFactory
from zoekt import app_settings, capacity, clock, search_health
from zoekt.admin import SETTINGS_FIELDS, ApplicationSettingForm
from zoekt.models import ApplicationSetting, Node
from zoekt.reasons import Reason
from zoekt.search_health import (
    fleet_gate_met,
    parse_version,
    process_health_reasons,
    search_exclusions,
    webserver_stale,
)

NEW = "v1.16.2"
OLD = "v1.15.9"
DEFAULT_MAX_RESTARTS = 1


def seen_ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


FRESH = seen_ago(5)


def metrics(**changes) -> dict:
    """One process's GitLab ``process_metrics`` block, healthy unless told otherwise."""
    return {
        "mmap_current": 10,
        "mmap_max": 1000,
        "restarts_1m": 0,
        "restarts_5m": 0,
        "restarts_15m": 0,
        "rss_bytes": 1024,
        "uptime_seconds": 3600,
        **changes,
    }


def metadata(
    *,
    version: str | None = NEW,
    indexer: dict | None = None,
    webserver: dict | None = None,
    **extra,
) -> dict:
    """Node metadata as a heartbeat leaves it; healthy unless told otherwise."""
    value: dict = {"name": "zoekt-test", **extra}
    if version is not None:
        value["version"] = version
    value["process_health"] = {
        "indexer": metrics(**(indexer or {})),
        "webserver": {**metrics(**(webserver or {})), "shards_loaded": 3},
    }
    return value


def reasons(
    value: dict | None,
    seen: datetime | None = FRESH,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
) -> list[Reason]:
    return process_health_reasons(value, seen, now=NOW, max_restarts=max_restarts)


# --- restarts -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("process", "restarts_15m", "max_restarts", "excluded"),
    [
        pytest.param("indexer", 1, 1, False, id="indexer-at-the-default-setting-stays"),
        pytest.param("indexer", 2, 1, True, id="indexer-one-above-the-default-setting-leaves"),
        pytest.param("webserver", 1, 1, False, id="webserver-at-the-default-setting-stays"),
        pytest.param("webserver", 2, 1, True, id="webserver-one-above-the-default-leaves"),
        pytest.param("indexer", 5, 5, False, id="indexer-at-setting-5-stays"),
        pytest.param("indexer", 6, 5, True, id="indexer-at-setting-5-plus-1-leaves"),
        pytest.param("webserver", 0, 0, False, id="setting-0-no-restart-stays"),
        pytest.param("indexer", 1, 0, True, id="setting-0-indexer-one-restart-leaves"),
        pytest.param("webserver", 1, 0, True, id="setting-0-webserver-one-restart-leaves"),
        pytest.param("indexer", 10, 10, False, id="raised-setting-10-at-10-stays"),
        pytest.param("indexer", 11, 10, True, id="raised-setting-10-at-11-leaves"),
    ],
)
def test_restarts_15m_above_the_setting_exclude_a_node(
    process, restarts_15m, max_restarts, excluded
):
    value = metadata(**{process: {"restarts_15m": restarts_15m}})
    expected = [Reason.PROCESS_RESTARTS_EXCEEDED] if excluded else []
    assert reasons(value, max_restarts=max_restarts) == expected


def test_one_process_over_the_limit_is_enough_whatever_the_other_reports():
    value = metadata(indexer={"restarts_15m": 0}, webserver={"restarts_15m": 99})
    assert reasons(value) == [Reason.PROCESS_RESTARTS_EXCEEDED]
    value = metadata(indexer={"restarts_15m": 99}, webserver={"restarts_15m": 0})
    assert reasons(value) == [Reason.PROCESS_RESTARTS_EXCEEDED]


def test_only_the_15_minute_window_counts():
    value = metadata(
        indexer={"restarts_1m": 50, "restarts_5m": 50},
        webserver={"restarts_1m": 50, "restarts_5m": 50},
    )
    assert reasons(value, max_restarts=0) == []


def test_the_old_restart_count_key_is_no_signal():
    """``restart_count`` is not a GitLab key: a stored one is ignored, never read as restarts."""
    value = metadata()
    for process in ("indexer", "webserver"):
        del value["process_health"][process]["restarts_15m"]
        value["process_health"][process]["restart_count"] = 99
    assert reasons(value, max_restarts=0) == []


# --- mmap ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("process", "current", "maximum", "excluded"),
    [
        pytest.param("webserver", 950, 1000, True, id="950-of-1000-leaves"),
        pytest.param("webserver", 949, 1000, False, id="949-of-1000-stays"),
        pytest.param("webserver", 95, 100, True, id="exactly-0.95-leaves"),
        pytest.param("webserver", 9499, 10_000, False, id="0.9499-stays"),
        pytest.param("webserver", 249_037, 262_144, True, id="0.95-of-linux-default-rounded-up"),
        pytest.param("webserver", 249_036, 262_144, False, id="just-under-0.95-of-linux-default"),
        pytest.param("webserver", 262_144, 262_144, True, id="at-the-maximum-leaves"),
        pytest.param("indexer", 950, 1000, True, id="indexer-950-of-1000-leaves"),
        pytest.param("indexer", 949, 1000, False, id="indexer-949-of-1000-stays"),
        pytest.param("webserver", 500, 0, False, id="max-0-is-no-signal"),
    ],
)
def test_mmap_at_95_percent_of_the_maximum_excludes_a_node(process, current, maximum, excluded):
    value = metadata(**{process: {"mmap_current": current, "mmap_max": maximum}})
    assert reasons(value) == ([Reason.MMAP_NEAR_LIMIT] if excluded else [])


def test_mmap_without_a_maximum_is_no_signal():
    value = metadata()
    del value["process_health"]["webserver"]["mmap_max"]
    value["process_health"]["webserver"]["mmap_current"] = 10**9
    assert reasons(value) == []


# --- the webserver's last report ----------------------------------------------------------------


def test_the_stale_threshold_is_the_30_second_online_threshold():
    assert search_health.WEBSERVER_STALE_SECONDS == 30
    assert search_health.WEBSERVER_STALE_SECONDS == capacity.ONLINE_DURATION_THRESHOLD_SECONDS


@pytest.mark.parametrize(
    ("seconds_ago", "stale"),
    [
        pytest.param(0, False, id="just-now"),
        pytest.param(29, False, id="29s-fresh"),
        pytest.param(30, False, id="exactly-30s-fresh"),
        pytest.param(30.001, True, id="just-over-30s-stale"),
        pytest.param(31, True, id="31s-stale"),
        pytest.param(3600, True, id="an-hour-stale"),
        pytest.param(-30, False, id="in-the-future-fresh"),
    ],
)
def test_a_webserver_unseen_for_more_than_30_seconds_is_stale(seconds_ago, stale):
    seen = seen_ago(seconds_ago)
    assert webserver_stale(seen, NOW) is stale
    assert reasons(metadata(), seen) == ([Reason.WEBSERVER_STALE] if stale else [])


def test_a_webserver_never_seen_is_stale():
    assert webserver_stale(None, NOW) is True
    assert reasons(metadata(), None) == [Reason.WEBSERVER_STALE]


def test_a_webserver_time_left_in_the_metadata_is_not_read():
    """The column is the webserver's last report; an old metadata key is ignored."""
    value = metadata(webserver_last_seen_at=NOW.isoformat())
    assert reasons(value, None) == [Reason.WEBSERVER_STALE]
    value = metadata(webserver_last_seen_at=seen_ago(3600).isoformat())
    assert reasons(value, FRESH) == []


# --- all together -----------------------------------------------------------------------------


def test_a_healthy_node_has_no_reasons():
    assert reasons(metadata()) == []


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({}, id="empty-metadata"),
        pytest.param({"version": NEW}, id="no-process-health"),
        pytest.param({"process_health": None}, id="process-health-null"),
        pytest.param({"process_health": {}}, id="process-health-empty"),
        pytest.param({"process_health": {"indexer": metrics()}}, id="no-webserver-block"),
        pytest.param({"process_health": {"webserver": metrics()}}, id="no-indexer-block"),
        pytest.param({"process_health": {"indexer": {}, "webserver": {}}}, id="no-counters"),
        pytest.param(
            {
                "process_health": {
                    "webserver": {"restarts_15m": True, "mmap_current": "a", "mmap_max": 10}
                }
            },
            id="counters-of-the-wrong-type",
        ),
        pytest.param(
            {"process_health": {"indexer": {"restarts_15m": -5, "mmap_current": -1}}},
            id="negative-counters",
        ),
        pytest.param(None, id="metadata-none"),
    ],
)
def test_missing_process_metrics_give_no_restart_or_mmap_signal(value):
    assert reasons(value, FRESH, max_restarts=0) == []
    # The webserver's staleness is the column's, whatever the metadata holds.
    assert reasons(value, None, max_restarts=0) == [Reason.WEBSERVER_STALE]


def test_every_reason_is_listed_in_a_fixed_order():
    value = metadata(
        indexer={"restarts_15m": 2},
        webserver={"mmap_current": 100, "mmap_max": 100},
    )
    assert reasons(value, seen_ago(31)) == [
        Reason.WEBSERVER_STALE,
        Reason.PROCESS_RESTARTS_EXCEEDED,
        Reason.MMAP_NEAR_LIMIT,
    ]
    assert [str(r) for r in reasons(value, seen_ago(31))] == [
        "webserver_stale",
        "process_restarts_exceeded",
        "mmap_near_limit",
    ]


# --- versions and the fleet gate ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        pytest.param("v1.16.2", (1, 16, 2), id="v-prefix"),
        pytest.param("1.16.0", (1, 16, 0), id="plain"),
        pytest.param("1.16.0-rc1", (1, 16, 0), id="pre-release-suffix-ignored"),
        pytest.param("v1.16.0+build.5", (1, 16, 0), id="build-metadata-ignored"),
        pytest.param("v2025.01.01-abc", (2025, 1, 1), id="date-version"),
        pytest.param(" v1.16.10 ", (1, 16, 10), id="surrounding-space"),
        pytest.param("1.16", None, id="no-patch"),
        pytest.param("dev", None, id="word"),
        pytest.param("", None, id="blank"),
        pytest.param("1.16.0abc", None, id="glued-suffix"),
        pytest.param(None, None, id="null"),
        pytest.param(1160, None, id="not-a-string"),
    ],
)
def test_versions_compare_on_major_minor_patch(value, parsed):
    assert parse_version(value) == parsed


@pytest.mark.parametrize(
    ("versions", "met"),
    [
        pytest.param(["v1.16.0", "v1.16.2", "v1.17.0"], True, id="all-new"),
        pytest.param(["v1.16.2", "1.15.9"], False, id="one-at-1.15.9"),
        pytest.param(["v1.16.2", None], False, id="one-missing"),
        pytest.param(["v1.16.2", "garbage"], False, id="one-unparsable"),
        pytest.param(["1.16.0-rc1"], True, id="release-candidate-counts-as-1.16.0"),
        pytest.param(["v2025.01.01-abc"], True, id="date-version-is-new"),
        pytest.param(["v0.99.99"], False, id="older-major"),
        pytest.param([], True, id="no-online-node"),
    ],
)
def test_the_gate_needs_every_online_node_at_1_16_0_or_later(versions, met):
    assert fleet_gate_met(versions) is met


def test_with_the_gate_not_met_nobody_is_excluded():
    sick = (metadata(webserver={"restarts_15m": 50}), seen_ago(600))
    never_seen = (metadata(), None)
    fleet = {1: sick, 2: never_seen, 3: (metadata(version="1.15.9"), FRESH)}
    assert search_exclusions(fleet, now=NOW, max_restarts=1) == {}
    del fleet[3]
    assert search_exclusions(fleet, now=NOW, max_restarts=1) == {
        1: [Reason.WEBSERVER_STALE, Reason.PROCESS_RESTARTS_EXCEEDED],
        2: [Reason.WEBSERVER_STALE],
    }


def test_the_gate_reads_the_version_from_the_metadata_of_every_node():
    fleet = {1: (metadata(webserver={"restarts_15m": 2}), FRESH), 2: (None, FRESH)}
    assert search_exclusions(fleet, now=NOW, max_restarts=1) == {}


# --- Node.objects.searchable ------------------------------------------------------------------


def searchable_ids() -> set[int]:
    return set(Node.objects.searchable().values_list("id", flat=True))


def set_max_restarts(value: int) -> None:
    row = app_settings.load_row()
    row.zoekt_max_restarts_15m = value
    row.save()


def search_node(value: dict | None = None, *, seen: datetime | None = FRESH, **kwargs) -> Node:
    """An online node with ``value`` as its metadata and its webserver last seen at ``seen``."""
    return NodeFactory(
        metadata=metadata() if value is None else value, webserver_last_seen_at=seen, **kwargs
    )


def offline_node(value: dict | None = None, **kwargs) -> Node:
    return search_node(value, last_seen_at=NOW - timedelta(seconds=31), **kwargs)


@pytest.mark.django_db
def test_searchable_is_online_search_nodes_that_are_healthy(now):
    healthy = search_node()
    offline = offline_node()
    not_for_search = search_node(services=[7])
    restarting = search_node(metadata(webserver={"restarts_15m": 2}))
    mmapped = search_node(metadata(indexer={"mmap_current": 950, "mmap_max": 1000}))
    stale = search_node(seen=seen_ago(31))
    never_seen = search_node(seen=None)

    assert searchable_ids() == {healthy.id}
    assert {
        offline.id,
        not_for_search.id,
        restarting.id,
        mmapped.id,
        stale.id,
        never_seen.id,
    }.isdisjoint(searchable_ids())


@pytest.mark.django_db
def test_searchable_excludes_nothing_at_the_thresholds(now):
    at_restarts = search_node(metadata(indexer={"restarts_15m": 1}))
    under_mmap = search_node(metadata(webserver={"mmap_current": 949, "mmap_max": 1000}))
    fresh = search_node(seen=seen_ago(29))
    exactly_30 = search_node(seen=seen_ago(30))
    assert searchable_ids() == {at_restarts.id, under_mmap.id, fresh.id, exactly_30.id}


@pytest.mark.django_db
def test_searchable_excludes_just_past_the_thresholds(now):
    keep = search_node()
    search_node(metadata(indexer={"restarts_15m": 2}))
    search_node(metadata(webserver={"mmap_current": 950, "mmap_max": 1000}))
    search_node(seen=seen_ago(31))
    assert searchable_ids() == {keep.id}


@pytest.mark.django_db
def test_a_node_without_a_webserver_time_leaves_search_once_the_gate_is_met(now):
    healthy = search_node()
    never_seen = search_node(seen=None)
    assert searchable_ids() == {healthy.id}

    old = search_node(metadata(version=OLD), seen=None)
    assert searchable_ids() == {healthy.id, never_seen.id, old.id}


@pytest.mark.django_db
def test_searchable_reads_the_column_not_a_metadata_key(now):
    node = search_node(metadata(webserver_last_seen_at=NOW.isoformat()), seen=None)
    assert searchable_ids() == set()
    Node.objects.filter(pk=node.pk).update(webserver_last_seen_at=FRESH)
    assert searchable_ids() == {node.id}


@pytest.mark.django_db
def test_one_online_node_at_1_15_9_keeps_every_node_searchable(now):
    sick = search_node(metadata(webserver={"restarts_15m": 60}), seen=seen_ago(600))
    old = search_node(metadata(version=OLD))
    assert searchable_ids() == {sick.id, old.id}


@pytest.mark.django_db
def test_an_offline_old_node_does_not_block_the_gate(now):
    sick = search_node(metadata(webserver={"restarts_15m": 60}))
    healthy = search_node()
    offline_node(metadata(version=OLD))
    assert searchable_ids() == {healthy.id}
    assert sick.id not in searchable_ids()


@pytest.mark.django_db
def test_an_online_node_without_a_version_means_the_gate_is_not_met(now):
    sick = search_node(seen=seen_ago(600))
    unversioned = search_node(metadata(version=None))
    assert searchable_ids() == {sick.id, unversioned.id}


@pytest.mark.django_db
def test_the_gate_counts_online_nodes_outside_the_filtered_queryset(now):
    sick = search_node(metadata(webserver={"restarts_15m": 60}))
    search_node(metadata(version=OLD))
    assert list(Node.objects.filter(pk=sick.pk).searchable().values_list("id", flat=True)) == [
        sick.id
    ]


@pytest.mark.django_db
def test_searchable_follows_the_max_restarts_setting(now):
    node = search_node(metadata(webserver={"restarts_15m": 8}))
    assert searchable_ids() == set()
    set_max_restarts(8)
    assert searchable_ids() == {node.id}
    set_max_restarts(7)
    assert searchable_ids() == set()


@pytest.mark.django_db
def test_a_max_restarts_of_0_excludes_a_node_with_one_restart(now):
    calm = search_node()
    once = search_node(metadata(indexer={"restarts_15m": 1}))
    assert searchable_ids() == {calm.id, once.id}
    set_max_restarts(0)
    assert searchable_ids() == {calm.id}


@pytest.mark.django_db
def test_searchable_moves_with_the_clock(now):
    node = search_node(seen=seen_ago(25))
    assert searchable_ids() == {node.id}
    clock.advance(5)  # the webserver reported exactly 30 s ago: not stale yet
    assert searchable_ids() == {node.id}
    clock.advance(1)  # 31 s; the node itself was seen 6 s ago and is online
    assert searchable_ids() == set()
    assert Node.objects.online().filter(pk=node.pk).exists()
    assert Node.objects.searchable(NOW).filter(pk=node.pk).exists()


def make_fleet(count: int) -> None:
    """Every third node sick, so the exclusion list grows with the fleet."""
    for i in range(count):
        sick = {"webserver": {"restarts_15m": 9}} if i % 3 == 0 else {}
        search_node(metadata(**sick))


def count_queries() -> tuple[int, int]:
    with CaptureQueriesContext(connection) as queries:
        found = len(list(Node.objects.searchable()))
    return len(queries), found


@pytest.mark.django_db
def test_searchable_costs_the_same_queries_for_3_and_30_nodes(now):
    app_settings.current()  # the settings read is cached; both measurements see it cached
    make_fleet(3)
    few_queries, few = count_queries()
    make_fleet(27)
    many_queries, many = count_queries()
    assert (few, many) == (2, 20)
    assert few_queries == many_queries == 2


# --- the zoekt_max_restarts_15m setting --------------------------------------------------------


@pytest.mark.django_db
def test_max_restarts_defaults_to_1():
    assert app_settings.DEFAULTS.max_restarts_15m == 1
    assert app_settings.current().max_restarts_15m == 1
    assert app_settings.load_row().zoekt_max_restarts_15m == 1


@pytest.mark.django_db
def test_the_old_setting_name_is_gone():
    assert not hasattr(app_settings.load_row(), "zoekt_search_max_restarts")
    assert not hasattr(app_settings.current(), "search_max_restarts")


@pytest.mark.django_db
def test_max_restarts_of_0_is_accepted():
    row = app_settings.load_row()
    row.zoekt_max_restarts_15m = 0
    row.full_clean()
    row.save()
    assert app_settings.current().max_restarts_15m == 0


@pytest.mark.django_db
def test_a_negative_max_restarts_is_refused_naming_the_field():
    row = app_settings.load_row()
    row.zoekt_max_restarts_15m = -1
    with pytest.raises(ValidationError) as excinfo:
        row.full_clean()
    assert "zoekt_max_restarts_15m" in excinfo.value.message_dict
    form_data = {
        name: getattr(row, name) for name in SETTINGS_FIELDS if getattr(row, name) is not False
    }
    form = ApplicationSettingForm(data=form_data, instance=app_settings.load_row())
    assert not form.is_valid()
    assert list(form.errors) == ["zoekt_max_restarts_15m"]
    assert app_settings.load_row().zoekt_max_restarts_15m == 1


@pytest.mark.django_db
def test_the_database_refuses_a_negative_max_restarts():
    app_settings.load_row()
    with pytest.raises(IntegrityError), transaction.atomic():
        ApplicationSetting.objects.filter(pk=1).update(zoekt_max_restarts_15m=-1)
    assert app_settings.load_row().zoekt_max_restarts_15m == 1
