"""Who writes a state machine's state, read from the source.

``state_writes(root)`` parses every module of the product's packages under
``root`` (migrations left out) and returns each place that writes the
``state`` of an ``Index``, a ``Repository`` or a ``Move`` (or the ``status`` of a
``NodeShutdown``, when the value written names one: ``NodeShutdown.Status.COMPLETE``):

* a call that writes rows with a ``state=`` keyword (``update``, ``create``,
  ``update_or_create``, ``get_or_create``, a model's constructor), or with
  ``"state"`` in its ``defaults``;
* an assignment to an attribute named ``state`` (``row.state = ...``), a
  ``setattr(row, "state", ...)``, or a ``bulk_update`` of the ``state`` field.

The machine is read from the value written (``Index.State.READY``,
``Case(When(..., then=Value(Repository.State.FAILED)))``). A value that names
no machine (a variable: ``update(state=state)``, ``move.state = state``) is
reported as ``"?"`` (as is ``cls.State.X``): a write the reader cannot place,
which only an owner may make. A write of another machine's state (``Task.State``, ``Replica.State``,
``HookEvent.State``...) is not reported.

A row created in its machine's initial state (``Index.objects.create(state=
Index.State.PENDING)``) is born, not moved: it is not reported either.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

#: The product's packages (the simulator and the tests are outside the rule).
PACKAGES = ("zoekt", "planner", "eviction", "api", "gitlab_sync", "dashboard")

#: The state machines the rule covers, and the state each is born in.
MACHINES = {"Index": "PENDING", "Repository": "PENDING", "Move": "PLANNED"}
#: Machines whose column is ``status`` (``<Machine>.Status.<X>``), and the status each is born
#: in. A write is reported only when its value names one of them (the reader does not guess
#: which model an unnamed ``status`` belongs to).
STATUS_MACHINES = {"NodeShutdown": "IN_PROGRESS"}

#: Methods that write rows (reads such as ``filter(state=...)`` are not writes).
WRITE_METHODS = frozenset({"update", "create", "update_or_create", "get_or_create"})
CREATE_METHODS = frozenset({"create", "get_or_create"})

#: The states of machines outside the rule: a write naming one of them is not reported.
OTHER_MACHINES = frozenset({"Task", "Replica", "HookEvent", "Sweep", "EvictionDecision"})


@dataclasses.dataclass(frozen=True, order=True)
class StateWrite:
    module: str
    line: int
    machine: str  # "Index", "Repository", "Move", or "?" when the value names none
    code: str


def _states_named(node: ast.AST, enum: str = "State") -> list[tuple[str, str]]:
    """``[(machine, state)]`` for every ``<Machine>.State.<STATE>`` inside ``node``
    (``<Machine>.Status.<STATUS>`` with ``enum="Status"``)."""
    found = []
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Attribute)
            and sub.value.attr == enum
            and isinstance(sub.value.value, ast.Name)
        ):
            found.append((sub.value.value.id, sub.attr))
    return found


def _machine(value: ast.AST) -> tuple[str | None, str | None]:
    """The covered machine a written value names (and its state when it is one constant),
    "?" when it names none, None when it names another machine's state."""
    named = _states_named(value)
    covered = [(m, s) for m, s in named if m in MACHINES]
    if covered:
        machine = covered[0][0]
        state = covered[0][1] if len(covered) == 1 else None
        return machine, state
    if named and all(m in OTHER_MACHINES for m, _ in named):
        return None, None
    return "?", None


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def _written_state(call: ast.Call, field: str = "state") -> ast.AST | None:
    for keyword in call.keywords:
        if keyword.arg == field:
            return keyword.value
        if keyword.arg == "defaults" and isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == field:
                    return value
    return None


def _writes(tree: ast.AST, field: str = "state"):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name == "setattr" and len(node.args) == 3:
                attr = node.args[1]
                if isinstance(attr, ast.Constant) and attr.value == field:
                    yield node, node.args[2], False
                continue
            if name == "bulk_update" and any(
                isinstance(sub, ast.Constant) and sub.value == field
                for arg in [*node.args[1:], *(k.value for k in node.keywords)]
                for sub in ast.walk(arg)
            ):
                yield node, ast.Name("state"), False  # the values are on the rows: unplaced
                continue
            if name not in WRITE_METHODS and name not in MACHINES and name not in STATUS_MACHINES:
                continue
            value = _written_state(node, field)
            if value is not None:
                yield (
                    node,
                    value,
                    name in CREATE_METHODS or name in MACHINES or name in STATUS_MACHINES,
                )
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None:
                continue
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == field:
                    yield node, node.value, False


def state_writes(root: Path, packages=PACKAGES) -> list[StateWrite]:
    """Every write of a covered machine's state (or of a state the reader cannot place)."""
    out: list[StateWrite] = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            source = path.read_text(encoding="utf-8")
            for node, value, creates in _writes(ast.parse(source, filename=str(path))):
                machine, state = _machine(value)
                if machine is None:
                    continue
                if creates and machine in MACHINES and state == MACHINES[machine]:
                    continue  # born in its initial state
                code = ast.get_source_segment(source, node) or ""
                out.append(StateWrite(module, node.lineno, machine, code.splitlines()[0]))
            out.extend(_status_writes(module, source))
    return sorted(out)


def _status_writes(module: str, source: str) -> list[StateWrite]:
    """Writes of a ``status`` machine's status that name one of its values
    (``NodeShutdown.Status.COMPLETE``); a record born in its first status is not one."""
    out = []
    for node, value, creates in _writes(ast.parse(source), field="status"):
        named = [(m, s) for m, s in _states_named(value, "Status") if m in STATUS_MACHINES]
        if not named:
            continue
        machine, status = named[0]
        if creates and len(named) == 1 and status == STATUS_MACHINES[machine]:
            continue  # born in its first status
        code = ast.get_source_segment(source, node) or ""
        out.append(StateWrite(module, node.lineno, machine, code.splitlines()[0]))
    return out
