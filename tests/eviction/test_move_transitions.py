"""A move's states change only through its one transition table (``Move.transition``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.eviction.conftest import ready_namespace
from tests.factories import NodeFactory
from zoekt import clock
from zoekt.models import IllegalTransition, Index, Move

S = Move.State
LEGAL = [(a, b) for a, targets in Move.TRANSITIONS.items() for b in sorted(targets)]
ILLEGAL = [(a, b) for a in S.values for b in S.values if b not in Move.TRANSITIONS[a]]


@pytest.fixture(autouse=True)
def _frozen(now):
    """The clock frozen: ``clock.advance`` steps it."""


def _move(state: str) -> Move:
    enabled = ready_namespace(NodeFactory(), 100)
    index = Index.objects.get(zoekt_enabled_namespace=enabled)
    now = clock.now()
    return Move.objects.create(**Move.fields_from_source(index, "node_level", now), state=state)


def _row(move: Move) -> dict:
    return Move.objects.filter(id=move.id).values().get()


def test_the_table_covers_every_state_and_names_only_states():
    assert set(Move.TRANSITIONS) == set(S.values)
    assert all(targets <= set(S.values) for targets in Move.TRANSITIONS.values())
    assert set(Move.STAMPS) <= set(S.values)
    assert set(Move.BIRTH_STATES) <= set(S.values)


def test_the_finished_states_go_nowhere_and_only_live_states_lead_on():
    for state in (S.FALLEN_BACK, S.PARKED, S.CANCELLED):
        assert Move.TRANSITIONS[state] == frozenset()
    for state in Move.LIVE:
        assert Move.TRANSITIONS[state], state


@pytest.mark.parametrize(("from_state", "to_state"), LEGAL, ids=[f"{a} → {b}" for a, b in LEGAL])
def test_every_legal_transition_writes_the_state_and_stamps_its_time(db, from_state, to_state):
    move = _move(from_state)
    clock.advance(60)
    now = clock.now()

    assert move.transition(to_state, now, reason="because") == to_state

    row = _row(move)
    assert row["state"] == to_state
    assert row["reason"] == "because"
    if stamp := Move.STAMPS.get(to_state):
        assert row[stamp] == now
    stamped = {column for column in Move.STAMPS.values() if row[column] is not None}
    assert stamped == ({Move.STAMPS[to_state]} if to_state in Move.STAMPS else set())


def test_a_state_entered_again_keeps_its_first_time(db):
    move = _move(S.SWAPPING)
    first = clock.now()
    move.transition(S.DONE, first)
    clock.advance(60)

    move.transition(S.DONE, clock.now(), details={"next_move_id": 7})

    row = _row(move)
    assert row["done_at"] == first
    assert row["details"] == {"next_move_id": 7}


@pytest.mark.parametrize(
    ("from_state", "to_state"), ILLEGAL, ids=[f"{a} → {b}" for a, b in ILLEGAL]
)
def test_an_illegal_transition_raises_and_writes_nothing(db, from_state, to_state):
    move = _move(from_state)
    before = _row(move)
    clock.advance(60)

    with pytest.raises(IllegalTransition) as raised:
        move.transition(to_state, clock.now(), reason="because")

    assert (raised.value.from_state, raised.value.to_state) == (from_state, to_state)
    assert move.state == from_state
    assert move.reason == ""
    assert _row(move) == before


def test_a_fallen_back_move_is_created_with_its_time(db):
    enabled = ready_namespace(NodeFactory(), 100)
    index = Index.objects.get(zoekt_enabled_namespace=enabled)
    now = clock.now() + timedelta(seconds=5)

    move = Move.fall_back(now, **Move.fields_from_source(index, "node_level", now))

    row = _row(move)
    assert row["state"] == S.FALLEN_BACK
    assert row["fallen_back_at"] == now
    assert Move.IllegalTransition is IllegalTransition
