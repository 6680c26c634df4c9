"""Search health: which nodes a search may go to (GitLab's ProcessHealth and Node.searchable).

The rule is checked as pure functions over node metadata first, at and
around each threshold, then through ``Node.objects.searchable``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from tests.conftest import NOW
from tests.factories import NodeFactory
from zoekt import app_settings, clock, search_health
from zoekt.admin import SETTINGS_FIELDS, ApplicationSettingForm
from zoekt.models import ApplicationSetting, Node
from zoekt.reasons import Reason
from zoekt.search_health import (
    fleet_gate_met,
    parse_version,
    process_health_reasons,
    search_exclusions,
)

NEW = "v1.16.2"
OLD = "v1.15.9"


def seen_ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).isoformat()


def metadata(
    *,
    version: str | None = NEW,
    indexer: dict | None = None,
    webserver: dict | None = None,
    webserver_seen_seconds_ago: float | None = 5,
    **extra,
) -> dict:
    """Node metadata as a heartbeat leaves it; healthy unless told otherwise."""
    value: dict = {"name": "zoekt-test", **extra}
    if version is not None:
        value["version"] = version
    value["process_health"] = {
        "indexer": {"restart_count": 0, "mmap_current": 10, "mmap_max": 1000, **(indexer or {})},
        "webserver": {
            "restart_count": 0,
            "mmap_current": 10,
            "mmap_max": 1000,
            **(webserver or {}),
        },
    }
    if webserver_seen_seconds_ago is not None:
        value["webserver_last_seen_at"] = seen_ago(webserver_seen_seconds_ago)
    return value


def reasons(value: dict, max_restarts: int = 5) -> list[Reason]:
    return process_health_reasons(value, now=NOW, max_restarts=max_restarts)


# --- restarts -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("process", "restart_count", "max_restarts", "excluded"),
    [
        pytest.param("indexer", 5, 5, False, id="indexer-at-the-setting-stays"),
        pytest.param("indexer", 6, 5, True, id="indexer-one-above-the-setting-leaves"),
        pytest.param("webserver", 5, 5, False, id="webserver-at-the-setting-stays"),
        pytest.param("webserver", 6, 5, True, id="webserver-one-above-the-setting-leaves"),
        pytest.param("webserver", 0, 0, False, id="setting-0-no-restart-stays"),
        pytest.param("indexer", 1, 0, True, id="setting-0-one-restart-leaves"),
        pytest.param("indexer", 10, 10, False, id="raised-setting-10-at-10-stays"),
    ],
)
def test_restarts_above_the_setting_exclude_a_node(process, restart_count, max_restarts, excluded):
    value = metadata(**{process: {"restart_count": restart_count}})
    expected = [Reason.PROCESS_RESTARTS_EXCEEDED] if excluded else []
    assert reasons(value, max_restarts) == expected


def test_one_process_over_the_limit_is_enough_whatever_the_other_reports():
    value = metadata(indexer={"restart_count": 0}, webserver={"restart_count": 99})
    assert reasons(value) == [Reason.PROCESS_RESTARTS_EXCEEDED]


# --- mmap ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("process", "current", "maximum", "excluded"),
    [
        pytest.param("webserver", 95, 100, True, id="exactly-0.95-leaves"),
        pytest.param("webserver", 9499, 10_000, False, id="0.9499-stays"),
        pytest.param("webserver", 249_037, 262_144, True, id="0.95-of-linux-default-rounded-up"),
        pytest.param("webserver", 249_036, 262_144, False, id="just-under-0.95-of-linux-default"),
        pytest.param("webserver", 262_144, 262_144, True, id="at-the-maximum-leaves"),
        pytest.param("indexer", 95, 100, True, id="indexer-at-0.95-leaves"),
        pytest.param("indexer", 94, 100, False, id="indexer-at-0.94-stays"),
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


# --- webserver heartbeat --------------------------------------------------------------------------


def test_the_stale_threshold_is_twice_the_online_threshold():
    assert search_health.WEBSERVER_STALE_SECONDS == 60


@pytest.mark.parametrize(
    ("seconds_ago", "stale"),
    [
        pytest.param(0, False, id="just-now"),
        pytest.param(59, False, id="59s-fresh"),
        pytest.param(59.999, False, id="just-under-60s-fresh"),
        pytest.param(60, True, id="exactly-60s-stale"),
        pytest.param(61, True, id="61s-stale"),
        pytest.param(3600, True, id="an-hour-stale"),
        pytest.param(-30, False, id="in-the-future-fresh"),
    ],
)
def test_a_webserver_unseen_for_60_seconds_is_stale(seconds_ago, stale):
    value = metadata(webserver_seen_seconds_ago=seconds_ago)
    assert reasons(value) == ([Reason.WEBSERVER_STALE] if stale else [])


@pytest.mark.parametrize(
    "seen",
    [
        pytest.param(None, id="never-stamped"),
        pytest.param("yesterday", id="unparsable"),
        pytest.param("2026-03-01T11:00:00", id="without-a-timezone"),
        pytest.param(12345, id="not-a-string"),
    ],
)
def test_a_webserver_time_that_is_missing_or_unreadable_is_no_signal(seen):
    value = metadata(webserver_seen_seconds_ago=None)
    if seen is not None:
        value["webserver_last_seen_at"] = seen
    assert reasons(value) == []


def test_a_utc_time_written_with_z_is_read():
    value = metadata(webserver_seen_seconds_ago=None)
    value["webserver_last_seen_at"] = "2026-03-01T11:58:59Z"  # 61 s before NOW
    assert reasons(value) == [Reason.WEBSERVER_STALE]


# --- all together -----------------------------------------------------------------------------


def test_a_healthy_node_has_no_reasons():
    assert reasons(metadata()) == []


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({}, id="empty-metadata"),
        pytest.param({"version": NEW}, id="no-process-health"),
        pytest.param({"process_health": None}, id="process-health-null"),
        pytest.param({"process_health": {"indexer": {}, "webserver": {}}}, id="no-counters"),
        pytest.param(
            {"process_health": {"webserver": {"restart_count": True, "mmap_current": "a"}}},
            id="counters-of-the-wrong-type",
        ),
        pytest.param(None, id="metadata-none"),
    ],
)
def test_missing_health_data_excludes_nobody(value):
    assert reasons(value) == []


def test_every_reason_is_listed_in_a_fixed_order():
    value = metadata(
        indexer={"restart_count": 6},
        webserver={"mmap_current": 100, "mmap_max": 100},
        webserver_seen_seconds_ago=61,
    )
    assert reasons(value) == [
        Reason.PROCESS_RESTARTS_EXCEEDED,
        Reason.MMAP_NEAR_LIMIT,
        Reason.WEBSERVER_STALE,
    ]
    assert [str(r) for r in reasons(value)] == [
        "process_restarts_exceeded",
        "mmap_near_limit",
        "webserver_stale",
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
    sick = metadata(webserver={"restart_count": 50}, webserver_seen_seconds_ago=600)
    fleet = {1: sick, 2: metadata(version="1.15.9")}
    assert search_exclusions(fleet, now=NOW, max_restarts=5) == {}
    del fleet[2]
    assert search_exclusions(fleet, now=NOW, max_restarts=5) == {
        1: [Reason.PROCESS_RESTARTS_EXCEEDED, Reason.WEBSERVER_STALE]
    }


# --- Node.objects.searchable ------------------------------------------------------------------


def searchable_ids() -> set[int]:
    return set(Node.objects.searchable().values_list("id", flat=True))


def set_max_restarts(value: int) -> None:
    row = app_settings.load_row()
    row.zoekt_max_restarts_15m = value
    row.save()


def offline_node(**kwargs) -> Node:
    return NodeFactory(last_seen_at=NOW - timedelta(seconds=31), **kwargs)


@pytest.mark.django_db
def test_searchable_is_online_search_nodes_that_are_healthy(now):
    healthy = NodeFactory(metadata=metadata())
    offline = offline_node(metadata=metadata())
    not_for_search = NodeFactory(metadata=metadata(), services=[7])
    restarting = NodeFactory(metadata=metadata(webserver={"restart_count": 6}))
    mmapped = NodeFactory(metadata=metadata(indexer={"mmap_current": 95, "mmap_max": 100}))
    stale = NodeFactory(metadata=metadata(webserver_seen_seconds_ago=61))

    assert searchable_ids() == {healthy.id}
    assert {offline.id, not_for_search.id, restarting.id, mmapped.id, stale.id}.isdisjoint(
        searchable_ids()
    )


@pytest.mark.django_db
def test_searchable_excludes_nothing_at_the_thresholds(now):
    at_restarts = NodeFactory(metadata=metadata(indexer={"restart_count": 5}))
    under_mmap = NodeFactory(
        metadata=metadata(webserver={"mmap_current": 9499, "mmap_max": 10_000})
    )
    fresh = NodeFactory(metadata=metadata(webserver_seen_seconds_ago=59))
    assert searchable_ids() == {at_restarts.id, under_mmap.id, fresh.id}


@pytest.mark.django_db
def test_one_online_node_at_1_15_9_keeps_every_node_searchable(now):
    sick = NodeFactory(metadata=metadata(webserver={"restart_count": 60}))
    old = NodeFactory(metadata=metadata(version=OLD))
    assert searchable_ids() == {sick.id, old.id}


@pytest.mark.django_db
def test_an_offline_old_node_does_not_block_the_gate(now):
    sick = NodeFactory(metadata=metadata(webserver={"restart_count": 60}))
    healthy = NodeFactory(metadata=metadata())
    offline_node(metadata=metadata(version=OLD))
    assert searchable_ids() == {healthy.id}
    assert sick.id not in searchable_ids()


@pytest.mark.django_db
def test_an_online_node_without_a_version_means_the_gate_is_not_met(now):
    sick = NodeFactory(metadata=metadata(webserver_seen_seconds_ago=600))
    unversioned = NodeFactory(metadata=metadata(version=None))
    assert searchable_ids() == {sick.id, unversioned.id}


@pytest.mark.django_db
def test_the_gate_counts_online_nodes_outside_the_filtered_queryset(now):
    sick = NodeFactory(metadata=metadata(webserver={"restart_count": 60}))
    NodeFactory(metadata=metadata(version=OLD))
    assert list(Node.objects.filter(pk=sick.pk).searchable().values_list("id", flat=True)) == [
        sick.id
    ]


@pytest.mark.django_db
def test_searchable_follows_the_max_restarts_setting(now):
    node = NodeFactory(metadata=metadata(webserver={"restart_count": 8}))
    assert searchable_ids() == set()
    set_max_restarts(8)
    assert searchable_ids() == {node.id}
    set_max_restarts(7)
    assert searchable_ids() == set()


@pytest.mark.django_db
def test_searchable_moves_with_the_clock(now):
    node = NodeFactory(metadata=metadata(webserver_seen_seconds_ago=50))
    assert searchable_ids() == {node.id}
    clock.advance(10)  # the webserver is now 60 s old; the node was seen 10 s ago
    assert searchable_ids() == set()
    assert Node.objects.searchable(NOW).filter(pk=node.pk).exists()


def make_fleet(count: int) -> None:
    """Every third node sick, so the exclusion list grows with the fleet."""
    for i in range(count):
        sick = {"webserver": {"restart_count": 9}} if i % 3 == 0 else {}
        NodeFactory(metadata=metadata(**sick))


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
def test_max_restarts_defaults_to_5():
    assert app_settings.current().max_restarts_15m == 5
    assert app_settings.load_row().zoekt_max_restarts_15m == 5


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
    assert app_settings.load_row().zoekt_max_restarts_15m == 5


@pytest.mark.django_db
def test_the_database_refuses_a_negative_max_restarts():
    app_settings.load_row()
    with pytest.raises(IntegrityError), transaction.atomic():
        ApplicationSetting.objects.filter(pk=1).update(zoekt_max_restarts_15m=-1)
    assert app_settings.load_row().zoekt_max_restarts_15m == 5
