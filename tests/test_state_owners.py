"""Each state machine has one owner: nothing else writes its state (tests.state_writes).

An index's and a repository's state change only through ``zoekt.transitions``,
a move's only through its transition table on the model (``Move.transition``),
a node shutdown record's status only through ``NodeShutdown.transition``.
The first tests read the real source; the rest feed the reader synthetic
modules, so a direct write is seen to fail the rule.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.state_writes import PACKAGES, state_writes

ROOT = Path(__file__).resolve().parent.parent

#: The one module allowed to write each machine's state ("?": a state the reader cannot
#: place, such as ``move.state = state`` inside the owner's own transition).
OWNERS = {
    "Index": {"zoekt.transitions"},
    "Repository": {"zoekt.transitions"},
    "Move": {"zoekt.models"},
    "NodeShutdown": {"zoekt.models"},
    "?": {"zoekt.transitions", "zoekt.models"},
}


def _outside_owners(writes):
    return [w for w in writes if w.module not in OWNERS[w.machine]]


def test_no_module_but_the_owner_writes_a_state():
    stray = [
        f"{w.module}:{w.line} writes {w.machine}.state: {w.code}"
        for w in _outside_owners(state_writes(ROOT))
    ]
    assert stray == []


def test_the_owners_write_the_states_they_own():
    writes = state_writes(ROOT)
    assert {w.machine for w in writes if w.module == "zoekt.transitions"} >= {
        "Index",
        "Repository",
    }
    assert any(w.module == "zoekt.models" for w in writes)


def test_the_reader_covers_the_product_packages():
    assert set(PACKAGES) == {"zoekt", "planner", "eviction", "api", "gitlab_sync", "dashboard"}


def _tree(tmp_path: Path, source: str, module: str = "eviction/somewhere.py") -> Path:
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
    (tmp_path / module).write_text(textwrap.dedent(source), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("source", "machine"),
    [
        pytest.param(
            "Index.objects.filter(id=1).update(state=Index.State.READY)",
            "Index",
            id="a bulk update",
        ),
        pytest.param("row.state = Repository.State.READY", "Repository", id="an assignment"),
        pytest.param(
            "Repository.objects.filter(id=1).update(state=Case(When(x=1, "
            "then=Value(Repository.State.FAILED))))",
            "Repository",
            id="a conditional update",
        ),
        pytest.param(
            "Move.objects.create(state=Move.State.FALLEN_BACK)", "Move", id="a create not planned"
        ),
        pytest.param("Index(state=Index.State.READY)", "Index", id="a constructor not pending"),
        pytest.param(
            'Move.objects.update_or_create(id=1, defaults={"state": Move.State.DONE})',
            "Move",
            id="update_or_create defaults",
        ),
        pytest.param('setattr(move, "state", Move.State.DONE)', "Move", id="setattr"),
        pytest.param("rows.update(state=state)", "?", id="a state the reader cannot place"),
        pytest.param("move.state = state", "?", id="an assignment of a variable"),
        pytest.param('Index.objects.bulk_update(rows, ["state"])', "?", id="a bulk_update"),
        pytest.param(
            "NodeShutdown.objects.filter(id=1).update(status=NodeShutdown.Status.COMPLETE)",
            "NodeShutdown",
            id="a shutdown record's bulk update",
        ),
        pytest.param(
            "record.status = NodeShutdown.Status.CANCELLED",
            "NodeShutdown",
            id="a shutdown record's assignment",
        ),
        pytest.param(
            "NodeShutdown.objects.create(status=NodeShutdown.Status.STALLED)",
            "NodeShutdown",
            id="a shutdown record created not in progress",
        ),
    ],
)
def test_a_direct_write_outside_the_owner_is_found(tmp_path, source, machine):
    writes = state_writes(_tree(tmp_path, source))

    assert [(w.module, w.machine) for w in writes] == [("eviction.somewhere", machine)]
    assert _outside_owners(writes) == writes


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("Index.objects.filter(state=Index.State.READY).count()", id="a read"),
        pytest.param("Index.objects.exclude(state=Index.State.READY)", id="an exclude"),
        pytest.param("Index.objects.create(state=Index.State.PENDING)", id="born pending"),
        pytest.param("Move.objects.create(state=Move.State.PLANNED)", id="born planned"),
        pytest.param("Task.objects.update(state=Task.State.DONE)", id="a task's state"),
        pytest.param("sweep.state = Sweep.State.FAILED", id="a sweep's state"),
        pytest.param(
            "NodeShutdown.objects.create(status=NodeShutdown.Status.IN_PROGRESS)",
            id="a shutdown record born in progress",
        ),
        pytest.param("Response(body, status=409)", id="a reply's status"),
        pytest.param("x = index.state == Index.State.READY", id="a comparison"),
    ],
)
def test_reads_births_and_other_machines_are_not_writes(tmp_path, source):
    assert state_writes(_tree(tmp_path, source)) == []


def test_a_migration_is_not_read(tmp_path):
    root = _tree(tmp_path, "")
    (root / "zoekt" / "migrations").mkdir()
    (root / "zoekt" / "migrations" / "0001_x.py").write_text(
        "Index.objects.update(state=Index.State.READY)\n", encoding="utf-8"
    )
    assert state_writes(root) == []
