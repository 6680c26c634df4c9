"""Eviction's events reach their jobs through the table the eviction app registers."""

from __future__ import annotations

import pytest

from eviction import tasks as eviction_tasks
from zoekt.scheduling import events


def test_every_eviction_event_dispatches_the_task_its_table_names():
    assert eviction_tasks.EVICTION_EVENTS == {
        "evict_from_nodes": "eviction.evict_from_nodes",
        "mark_indices_pending_eviction": "eviction.mark_indices_pending_eviction",
        "evict_overcommitted_nodes": "eviction.evict_overcommitted_nodes",
        "evict_indices": "zoekt.evict_indices",
    }
    for event, task_name in eviction_tasks.EVICTION_EVENTS.items():
        assert events.REGISTERED[event] == task_name
        assert events.task_for(event).name == task_name


def test_zoekt_events_dispatch_their_own_tasks():
    for event, task in events.EVENTS.items():
        assert events.task_for(event) is task


def test_registering_the_same_table_again_changes_nothing():
    before = dict(events.REGISTERED)
    events.register_events(eviction_tasks.EVICTION_EVENTS)
    assert dict(events.REGISTERED) == before


@pytest.mark.parametrize(
    "table",
    [
        pytest.param({"evict_indices": "somewhere.else"}, id="a registered event"),
        pytest.param({"index_repos": "somewhere.else"}, id="one of zoekt's own events"),
        pytest.param(
            {"a_new_event": "somewhere.new", "evict_indices": "somewhere.else"},
            id="a table with one clash registers none of it",
        ),
    ],
)
def test_an_event_with_a_job_already_is_refused_and_nothing_changes(table):
    before = dict(events.REGISTERED)
    with pytest.raises(ValueError, match="has a job already"):
        events.register_events(table)
    assert dict(events.REGISTERED) == before


def test_an_event_nobody_registered_is_not_dispatched():
    with pytest.raises(KeyError):
        events.task_for("no_such_event")
