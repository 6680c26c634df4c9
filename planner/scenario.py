"""The planner's input: a *scenario*, parsed and validated into frozen dataclasses.

A scenario is everything the planner needs to know, as plain data (the
``plan-scenario`` contract): the options, the candidate nodes in candidate
order, and the enabled namespaces to plan with their projects and existing
replicas. ``parse_scenario`` turns the JSON-shaped dict into the dataclasses
below, or raises ``ScenarioError(field_path, message)`` naming the first bad
field, e.g. ``nodes[2].unclaimed_storage_bytes``.

Normalisations (so equal scenarios give equal plans):

* each namespace's projects are stored sorted by ``project_namespace_id``
  (the order the planner visits them in); the input order is irrelevant;
* nodes and namespaces keep their input order: node order is the candidate
  order, namespace order is the order the run plans them in.

No Django import here, nor anywhere in the planner core.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from itertools import compress
from operator import itemgetter
from typing import Any, NamedTuple

import orjson

#: GitLab's replica state enum (``zoekt_replicas.state``): name → stored value.
REPLICA_STATES: Mapping[str, int] = {"pending": 0, "ready": 10}

DEFAULT_BUFFER_FACTOR = 3
DEFAULT_MAX_INDICES_PER_REPLICA = 10
DEFAULT_MEMORY_RATIO = 0.5
#: How many namespaces' worth of memory a node should carry at once: an
#: index may grow to ``budget / CONCURRENCY_FACTOR`` of estimated memory
#: (``max_memory_bytes``). A constant with a stated default, overridable per
#: scenario by ``options.memory.concurrency_factor``; the derivation of 4 is
#: in docs/planner.md ("Memory: the concurrency factor").
CONCURRENCY_FACTOR = 4
DEFAULT_CONCURRENCY_FACTOR = CONCURRENCY_FACTOR

#: Capacity dimensions a node carries. Disk is always planned; memory only
#: when some node has a memory budget (``Scenario.memory_on``).
DISK = "disk"
MEMORY = "memory"

ROOT = "scenario"


class ScenarioError(ValueError):
    """An invalid scenario: ``field_path`` names the bad field, ``message`` says why."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path
        self.message = message


# --------------------------------------------------------------------------- #
# The dataclasses
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class MemoryOptions:
    """``options.memory``: the memory dimension's settings (docs/planner.md, "Memory").

    ``node_memory_budget_bytes`` is the configured per-node budget (source A),
    used by every node without a budget of its own; unset (the default) it
    leaves the memory dimension off unless some node carries its own budget.
    """

    node_memory_budget_bytes: int | None = None
    memory_ratio: int | float = DEFAULT_MEMORY_RATIO
    concurrency_factor: int | float = DEFAULT_CONCURRENCY_FACTOR

    def estimate(self, repository_size: int) -> int:
        """A project's estimated resident memory: ``repository_size × memory_ratio``.

        Not multiplied by ``buffer_factor``. The ratio is taken at its shortest
        decimal form (``0.1`` is exactly 1/10) and the product rounded *up* to
        whole bytes, as scaled sizes are; an index's estimate is the sum of its
        projects' estimates.
        """
        num, den = _factor_ratio(self.memory_ratio)
        if den == 1:
            return repository_size * num
        return -(-repository_size * num // den)

    def ceiling(self, budget: int) -> int:
        """``max_memory_bytes`` for an index on a node with this budget.

        ``budget / concurrency_factor`` rounded *down* (the factor at its
        shortest decimal form), so the ceiling never exceeds the exact quotient.
        """
        num, den = _factor_ratio(self.concurrency_factor)
        return budget * den // num


#: ``options.strategy``: GitLab's first fit (the contract's default), or balanced.
FIRST_FIT = "first_fit"
BALANCED = "balanced"
STRATEGIES = (FIRST_FIT, BALANCED)

#: ``options.order``: namespaces planned in the given order (GitLab's, the
#: default), or the namespaces to create largest first (the product's balanced
#: placement; the plan still lists them in the given order).
GIVEN_ORDER = "given"
LARGEST_FIRST = "largest_first"
ORDERS = (GIVEN_ORDER, LARGEST_FIRST)

#: The product's balanced placement beyond the choice among fitting nodes: the
#: namespaces of a run planned largest first, and no new index claiming more
#: than a quarter of its node's unclaimed storage (memory's ceiling is a
#: quarter of the budget too, ``CONCURRENCY_FACTOR``).
BALANCED_INDEX_STORAGE_FRACTION = 0.25


def placement_options(strategy: str) -> dict[str, Any]:
    """The scenario options that go with ``zoekt_placement_strategy``: GitLab's
    order and index size for ``first_fit``; largest first and the disk ceiling
    per index for ``balanced``."""
    if strategy == BALANCED:
        return {
            "order": LARGEST_FIRST,
            "max_index_storage_fraction": BALANCED_INDEX_STORAGE_FRACTION,
        }
    return {"order": GIVEN_ORDER, "max_index_storage_fraction": None}


@dataclass(frozen=True, slots=True)
class Options:
    buffer_factor: int | float = DEFAULT_BUFFER_FACTOR
    max_indices_per_replica: int = DEFAULT_MAX_INDICES_PER_REPLICA
    memory: MemoryOptions = field(default_factory=MemoryOptions)
    strategy: str = FIRST_FIT
    order: str = GIVEN_ORDER
    #: ``options.max_index_storage_fraction``: a new index's ``max_storage_bytes``
    #: is at most this share of its node's unclaimed storage at the start of the
    #: run (never less than the project that opens it). ``None``: GitLab's rule,
    #: the node's whole unclaimed storage.
    max_index_storage_fraction: int | float | None = None

    def scale(self, repository_size: int) -> int:
        """A project's planned bytes: ``repository_size × buffer_factor``, whole bytes.

        With an integral factor (``3`` or ``3.0``) this is exact integer
        arithmetic, as in GitLab. With a fractional factor the factor is taken
        at its shortest decimal form (``1.1`` is exactly 11/10, not the nearest
        binary double) and the product is rounded *up* to whole bytes, so a
        reservation is never smaller than the exact product.
        """
        num, den = _factor_ratio(self.buffer_factor)
        if den == 1:
            return repository_size * num
        return -(-repository_size * num // den)


@dataclass(frozen=True, slots=True)
class WebserverHealth:
    rss_bytes: int | None = None
    shards_loaded: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessHealth:
    """The node's last reported ``process_health`` (only the webserver part is kept)."""

    webserver: WebserverHealth | None = None


@dataclass(frozen=True, slots=True)
class Node:
    id: int
    unclaimed_storage_bytes: int
    #: The node's own memory budget (source B, filled by the loader only when
    #: the node reports a limit and passes the version gate); ``None`` takes
    #: ``options.memory.node_memory_budget_bytes``.
    memory_budget_bytes: int | None = None
    process_health: ProcessHealth | None = None
    #: An extension of the contract: the estimated memory of the indices the
    #: node already holds (the sum of their ``estimated_memory_bytes``), the
    #: memory counterpart of the disk reservations already netted out of
    #: ``unclaimed_storage_bytes``. ``None`` is 0. Not observed RSS.
    reserved_memory_bytes: int | None = None
    #: The node's name (its metadata's ``name``), copied into the plan as
    #: ``node_name`` / ``name`` when any node of the scenario has one.
    name: str | None = None
    #: An extension of the contract: the node's disk size (GitLab's
    #: ``zoekt_nodes.total_bytes``, as the node reports it), what the
    #: ``balanced`` strategy scores a node's room against. ``None`` (or less
    #: than the unclaimed storage): the unclaimed storage is taken for it.
    total_bytes: int | None = None
    #: An extension of the contract: the node's failure domain (an availability
    #: zone, a rack), or ``None``. When any node has one, the replicas of a
    #: namespace go to distinct zones where the zones allow it (docs/planner.md,
    #: "Zones"); when none has, the plan is GitLab's, byte for byte.
    zone: str | None = None

    @property
    def capacities(self) -> dict[str, int]:
        """What the node has left, per planning dimension (bytes)."""
        return {DISK: self.unclaimed_storage_bytes}


class Project(NamedTuple):
    """A project to place (a tuple: a scenario can hold a million of them)."""

    project_namespace_id: int
    project_id: int
    #: Gitaly repository size in bytes; ``None`` when the project has no
    #: statistics (the planner skips it).
    repository_size: int | None


@dataclass(frozen=True, slots=True)
class ExistingReplica:
    id: int
    state: str

    @property
    def state_value(self) -> int:
        return REPLICA_STATES[self.state]


@dataclass(frozen=True, slots=True)
class Namespace:
    enabled_namespace_id: int
    namespace_id: int
    number_of_replicas: int = 1
    existing_replicas: tuple[ExistingReplica, ...] = ()
    #: Every project as parallel columns sorted by project namespace id:
    #: project namespace ids, project ids, repository sizes (``None``: no
    #: statistics). Columns, not objects: a scenario can hold a million.
    project_columns: tuple[list[int], list[int], list[int | None]] = ([], [], [])
    #: Every node that already holds an index of the namespace, in any state
    #: (GitLab's newest planner never places another index there).
    existing_node_ids: tuple[int, ...] = ()
    #: The projects *with statistics* as the same columns: what the core plans.
    columns: tuple[list[int], list[int], list[int]] = field(
        default=([], [], []), compare=False, repr=False
    )
    #: An extension of the contract: the zones of the nodes that hold an index of
    #: the namespace and are not among the scenario's nodes (a node that is, says
    #: its own ``zone``). Only read when some node has a zone.
    existing_zones: tuple[str, ...] = ()
    #: The repository bytes of the projects with statistics (what
    #: ``order: largest_first`` sorts by), summed once here.
    repository_bytes: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "repository_bytes", sum(self.columns[2]))

    @property
    def projects(self) -> tuple[Project, ...]:
        """Every project, sorted by ``project_namespace_id``."""
        return tuple(map(_NEW_PROJECT, zip(*self.project_columns, strict=True)))

    @property
    def has_projects(self) -> bool:
        return bool(self.project_columns[0])


@dataclass(frozen=True, slots=True)
class Scenario:
    options: Options
    nodes: tuple[Node, ...]
    namespaces: tuple[Namespace, ...]

    def memory_budget(self, node: Node) -> int | None:
        """The node's memory budget: its own, else the configured one, else none."""
        if node.memory_budget_bytes is not None:
            return node.memory_budget_bytes
        return self.options.memory.node_memory_budget_bytes

    @property
    def memory_on(self) -> bool:
        """The memory dimension is on when any node ends up with a budget."""
        return any(self.memory_budget(node) is not None for node in self.nodes)

    @classmethod
    def from_dict(cls, data: Any) -> Scenario:
        return parse_scenario(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> Scenario:
        return parse_scenario(load_json(text))


# --------------------------------------------------------------------------- #
# Parsing
# --------------------------------------------------------------------------- #


_BOM = b"\xef\xbb\xbf"


def load_json(text: str | bytes) -> Any:
    """Decode JSON (RFC 8259, UTF-8), turning every problem into a ``ScenarioError``.

    ``orjson`` decodes: strict UTF-8, no ``NaN``/``Infinity``, nesting at
    most 1,024 deep. In an object with a duplicated key the last value wins,
    as in most parsers (RFC 8259 leaves it open); a leading byte-order mark
    is skipped.
    """
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    elif text[:3] == _BOM:
        text = text[3:]
    try:
        with gc_paused():
            return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ScenarioError(
            ROOT, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one bulk step, then restore it.

    Parsing and planning a large scenario allocate millions of small objects
    that all stay alive; each allocation burst would otherwise trigger full
    collections that walk the whole (acyclic) heap again and again, which
    made planning a million projects several times slower. Reference
    counting still frees everything as usual.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_scenario(data: Any) -> Scenario:
    """Validate a JSON-shaped scenario and return it as dataclasses.

    Raises ``ScenarioError`` for the first problem found.
    """
    with gc_paused():
        return _parse_scenario(data)


def _parse_scenario(data: Any) -> Scenario:
    obj = _object(data, ROOT)
    _known_keys(obj, ROOT, ("options", "nodes", "namespaces"), required=("nodes", "namespaces"))
    options = _parse_options(obj.get("options"), "options")
    nodes = _parse_nodes(obj["nodes"], "nodes")
    namespaces = _parse_namespaces(obj["namespaces"], "namespaces")
    return Scenario(options=options, nodes=nodes, namespaces=namespaces)


def _parse_options(value: Any, path: str) -> Options:
    if value is None:
        return Options()
    obj = _object(value, path)
    _known_keys(
        obj,
        path,
        (
            "buffer_factor",
            "max_index_storage_fraction",
            "max_indices_per_replica",
            "memory",
            "order",
            "strategy",
        ),
    )
    buffer_factor = DEFAULT_BUFFER_FACTOR
    if obj.get("buffer_factor") is not None:
        buffer_factor = _positive_number(obj["buffer_factor"], f"{path}.buffer_factor")
        if isinstance(buffer_factor, float) and buffer_factor.is_integer():
            buffer_factor = int(buffer_factor)
    max_indices = DEFAULT_MAX_INDICES_PER_REPLICA
    if obj.get("max_indices_per_replica") is not None:
        max_indices = _int(
            obj["max_indices_per_replica"], f"{path}.max_indices_per_replica", minimum=1
        )
    memory = _parse_memory_options(obj.get("memory"), f"{path}.memory")
    strategy = _one_of(obj.get("strategy"), f"{path}.strategy", STRATEGIES)
    order = _one_of(obj.get("order"), f"{path}.order", ORDERS)
    fraction = obj.get("max_index_storage_fraction")
    if fraction is not None:
        fraction = _positive_number(fraction, f"{path}.max_index_storage_fraction")
        if fraction > 1:
            raise ScenarioError(
                f"{path}.max_index_storage_fraction",
                "must be at most 1 (a share of the node's unclaimed storage), "
                f"got {_show(fraction)}",
            )
        if fraction == 1:
            fraction = None  # the whole: GitLab's rule
    return Options(
        buffer_factor=buffer_factor,
        max_indices_per_replica=max_indices,
        memory=memory,
        strategy=strategy,
        order=order,
        max_index_storage_fraction=fraction,
    )


def _parse_memory_options(value: Any, path: str) -> MemoryOptions:
    if value is None:
        return MemoryOptions()
    obj = _object(value, path)
    _known_keys(obj, path, ("node_memory_budget_bytes", "memory_ratio", "concurrency_factor"))
    budget = _optional_int(obj.get("node_memory_budget_bytes"), f"{path}.node_memory_budget_bytes")
    ratio = DEFAULT_MEMORY_RATIO
    if obj.get("memory_ratio") is not None:
        ratio = _positive_number(obj["memory_ratio"], f"{path}.memory_ratio")
    concurrency = DEFAULT_CONCURRENCY_FACTOR
    if obj.get("concurrency_factor") is not None:
        concurrency = _positive_number(obj["concurrency_factor"], f"{path}.concurrency_factor")
    return MemoryOptions(
        node_memory_budget_bytes=budget, memory_ratio=ratio, concurrency_factor=concurrency
    )


_NODE_KEYS = (
    "id",
    "unclaimed_storage_bytes",
    "memory_budget_bytes",
    "process_health",
    "reserved_memory_bytes",
    "name",
    "total_bytes",
    "zone",
)


def _parse_nodes(value: Any, path: str) -> tuple[Node, ...]:
    items = _list(value, path)
    nodes: list[Node] = []
    seen: dict[int, int] = {}
    for i, item in enumerate(items):
        p = f"{path}[{i}]"
        obj = _object(item, p)
        _known_keys(obj, p, _NODE_KEYS, required=("id", "unclaimed_storage_bytes"))
        node_id = _int(obj["id"], f"{p}.id", minimum=0)
        if node_id in seen:
            raise ScenarioError(
                f"{p}.id", f"duplicate node id {node_id} (also {path}[{seen[node_id]}])"
            )
        seen[node_id] = i
        # Unclaimed bytes may be negative: GitLab's reservations can exceed
        # usable storage (reference 4.1).
        unclaimed = _int(obj["unclaimed_storage_bytes"], f"{p}.unclaimed_storage_bytes")
        budget = _optional_int(obj.get("memory_budget_bytes"), f"{p}.memory_budget_bytes")
        health = _parse_process_health(obj.get("process_health"), f"{p}.process_health")
        reserved = _optional_int(obj.get("reserved_memory_bytes"), f"{p}.reserved_memory_bytes")
        name = obj.get("name")
        if name is not None and not isinstance(name, str):
            raise ScenarioError(f"{p}.name", f"expected a string or null, got {_show(name)}")
        total = obj.get("total_bytes")
        if total is not None:
            total = _int(total, f"{p}.total_bytes", minimum=0)
        zone = _optional_zone(obj.get("zone"), f"{p}.zone")
        nodes.append(Node(node_id, unclaimed, budget, health, reserved, name, total, zone))
    return tuple(nodes)


def _parse_process_health(value: Any, path: str) -> ProcessHealth | None:
    if value is None:
        return None
    obj = _object(value, path)
    # Other parts (indexer, counters) are accepted and not kept.
    webserver = obj.get("webserver")
    if webserver is None:
        return ProcessHealth()
    wpath = f"{path}.webserver"
    web = _object(webserver, wpath)
    return ProcessHealth(
        WebserverHealth(
            rss_bytes=_optional_int(web.get("rss_bytes"), f"{wpath}.rss_bytes"),
            shards_loaded=_optional_int(web.get("shards_loaded"), f"{wpath}.shards_loaded"),
        )
    )


_NAMESPACE_KEYS = (
    "enabled_namespace_id",
    "namespace_id",
    "number_of_replicas",
    "existing_replicas",
    "projects",
    "existing_node_ids",
    "existing_zones",
)
_NAMESPACE_KEY_SET = frozenset(_NAMESPACE_KEYS)


def _parse_namespaces(value: Any, path: str) -> tuple[Namespace, ...]:
    items = _list(value, path)
    namespaces: list[Namespace] = []
    seen_enabled: dict[int, int] = {}
    seen_root: dict[int, int] = {}
    for i, obj in enumerate(items):
        enabled_id = obj.get("enabled_namespace_id") if type(obj) is dict else None
        root_id = obj.get("namespace_id") if type(obj) is dict else None
        replicas = obj.get("number_of_replicas", 1) if type(obj) is dict else None
        if (
            type(enabled_id) is int
            and type(root_id) is int
            and type(replicas) is int
            and enabled_id >= 0
            and root_id >= 0
            and replicas >= 0
            and enabled_id not in seen_enabled
            and root_id not in seen_root
            and _NAMESPACE_KEY_SET.issuperset(obj)
        ):
            # The common case, checked without building a single field path.
            seen_enabled[enabled_id] = i
            seen_root[root_id] = i
            existing = obj.get("existing_replicas")
            projects = obj.get("projects")
            node_ids = obj.get("existing_node_ids")
            zones = obj.get("existing_zones")
            all_columns, columns = (
                _NO_PROJECTS
                if projects is None or projects == []
                else _parse_projects(projects, f"{path}[{i}].projects")
            )
            namespaces.append(
                Namespace(
                    enabled_id,
                    root_id,
                    replicas,
                    ()
                    if existing is None or existing == []
                    else _parse_existing_replicas(existing, f"{path}[{i}].existing_replicas"),
                    all_columns,
                    ()
                    if node_ids is None or node_ids == []
                    else _parse_node_ids(node_ids, f"{path}[{i}].existing_node_ids"),
                    columns,
                    _parse_zones(zones, f"{path}[{i}].existing_zones") if zones else (),
                )
            )
            continue
        p = f"{path}[{i}]"
        obj = _object(obj, p)
        _known_keys(obj, p, _NAMESPACE_KEYS, required=("enabled_namespace_id", "namespace_id"))
        enabled_id = _int(obj["enabled_namespace_id"], f"{p}.enabled_namespace_id", minimum=0)
        if enabled_id in seen_enabled:
            raise ScenarioError(
                f"{p}.enabled_namespace_id",
                f"duplicate enabled namespace id {enabled_id} "
                f"(also {path}[{seen_enabled[enabled_id]}])",
            )
        seen_enabled[enabled_id] = i
        root_id = _int(obj["namespace_id"], f"{p}.namespace_id", minimum=0)
        if root_id in seen_root:
            raise ScenarioError(
                f"{p}.namespace_id",
                f"duplicate namespace id {root_id} (also {path}[{seen_root[root_id]}]); "
                "a root namespace is enabled at most once",
            )
        seen_root[root_id] = i
        replicas = 1
        if obj.get("number_of_replicas") is not None:
            # 0 is valid: every existing replica is destroyed, as in GitLab.
            replicas = _int(obj["number_of_replicas"], f"{p}.number_of_replicas", minimum=0)
        existing = _parse_existing_replicas(obj.get("existing_replicas"), f"{p}.existing_replicas")
        all_columns, columns = _parse_projects(obj.get("projects"), f"{p}.projects")
        node_ids = _parse_node_ids(obj.get("existing_node_ids"), f"{p}.existing_node_ids")
        zones = _parse_zones(obj.get("existing_zones"), f"{p}.existing_zones")
        fields = (enabled_id, root_id, replicas, existing, all_columns, node_ids, columns, zones)
        namespaces.append(Namespace(*fields))
    return tuple(namespaces)


def _parse_node_ids(value: Any, path: str) -> tuple[int, ...]:
    if value is None:
        return ()
    items = _list(value, path)
    seen: dict[int, int] = {}
    for i, item in enumerate(items):
        node_id = _int(item, f"{path}[{i}]", minimum=0)
        if node_id in seen:
            raise ScenarioError(
                f"{path}[{i}]", f"duplicate node id {node_id} (also {path}[{seen[node_id]}])"
            )
        seen[node_id] = i
    return tuple(items)


def _parse_zones(value: Any, path: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = _list(value, path)
    return tuple(dict.fromkeys(_zone(item, f"{path}[{i}]") for i, item in enumerate(items)))


def _optional_zone(value: Any, path: str) -> str | None:
    return None if value is None else _zone(value, path)


def _zone(value: Any, path: str) -> str:
    """A zone label: a non-empty string of at most 63 characters."""
    if not isinstance(value, str):
        raise ScenarioError(path, f"expected a string or null, got {_show(value)}")
    if not 1 <= len(value) <= 63:
        raise ScenarioError(path, f"must be 1 to 63 characters, got {len(value)}")
    return value


def _parse_existing_replicas(value: Any, path: str) -> tuple[ExistingReplica, ...]:
    if value is None:
        return ()
    items = _list(value, path)
    replicas: list[ExistingReplica] = []
    seen: dict[int, int] = {}
    for i, item in enumerate(items):
        p = f"{path}[{i}]"
        obj = _object(item, p)
        _known_keys(obj, p, ("id", "state"), required=("id", "state"))
        replica_id = _int(obj["id"], f"{p}.id", minimum=0)
        if replica_id in seen:
            raise ScenarioError(
                f"{p}.id", f"duplicate replica id {replica_id} (also {path}[{seen[replica_id]}])"
            )
        seen[replica_id] = i
        state = obj["state"]
        if not isinstance(state, str) or state not in REPLICA_STATES:
            allowed = ", ".join(REPLICA_STATES)
            raise ScenarioError(f"{p}.state", f"expected one of {allowed}, got {_show(state)}")
        replicas.append(ExistingReplica(replica_id, state))
    return tuple(replicas)


_PROJECT_KEYS = ("project_namespace_id", "project_id", "repository_size")
_PNIDS = itemgetter("project_namespace_id")
_PIDS = itemgetter("project_id")
_SIZES = itemgetter("repository_size")
_FIRST = itemgetter(0)
_NEW_PROJECT = partial(tuple.__new__, Project)
_INT = frozenset({int})
_SIZE_TYPES = frozenset({int, type(None)})


_Columns = tuple[list[int], list[int], list[int | None]]
_NO_PROJECTS: tuple[_Columns, _Columns] = (([], [], []), ([], [], []))


def _parse_projects(value: Any, path: str) -> tuple[_Columns, _Columns]:
    """Every project's columns sorted by project namespace id, and those with statistics.

    The hot path of parsing: a scenario can hold a million projects. Every
    check runs over a whole column at C speed (``map``, ``set``, ``min``);
    only when one fails does a per-project walk find the first bad project
    and name its field.
    """
    if value is None:
        return _NO_PROJECTS
    items = _list(value, path)
    if not items:
        return _NO_PROJECTS
    try:
        if not _DICT.issuperset(map(type, items)) or set(map(len, items)) != {3}:
            raise _BadProject
        pnids = list(map(_PNIDS, items))
        pids = list(map(_PIDS, items))
        sizes = list(map(_SIZES, items))
        if (
            not _INT.issuperset(map(type, pnids))
            or not _INT.issuperset(map(type, pids))
            or not _SIZE_TYPES.issuperset(map(type, sizes))
            or min(pnids) < 0
            or min(pids) < 0
            or min([size for size in sizes if size is not None], default=0) < 0
        ):
            raise _BadProject
    except (_BadProject, KeyError):
        bad = True
    else:
        bad = False
    if bad:
        for i, item in enumerate(items):
            _check_project(item, f"{path}[{i}]")
        raise AssertionError(f"{path}: rejected by the fast checks but not by the helpers")
    if len(set(pnids)) != len(pnids):
        first: dict[int, int] = {}
        for i, pnid in enumerate(pnids):
            if pnid in first:
                raise ScenarioError(
                    f"{path}[{i}].project_namespace_id",
                    f"duplicate project namespace id {pnid} (also {path}[{first[pnid]}])",
                )
            first[pnid] = i
    if len(set(pids)) != len(pids):
        first = {}
        for i, pid in enumerate(pids):
            if pid in first:
                raise ScenarioError(
                    f"{path}[{i}].project_id",
                    f"duplicate project id {pid} (also {path}[{first[pid]}])",
                )
            first[pid] = i
    if pnids != sorted(pnids):
        rows = sorted(zip(pnids, pids, sizes, strict=True), key=_FIRST)
        pnids, pids, sizes = (list(column) for column in zip(*rows, strict=True))
    if None in sizes:
        known = [size is not None for size in sizes]
        return (pnids, pids, sizes), (
            list(compress(pnids, known)),
            list(compress(pids, known)),
            list(compress(sizes, known)),
        )
    return (pnids, pids, sizes), (pnids, pids, sizes)


_DICT = frozenset({dict})


class _BadProject(Exception):
    pass


def _check_project(item: Any, path: str) -> None:
    """Raise the precise error for a bad project; return for a good one."""
    obj = _object(item, path)
    _known_keys(obj, path, _PROJECT_KEYS, required=_PROJECT_KEYS)
    _int(obj["project_namespace_id"], f"{path}.project_namespace_id", minimum=0)
    _int(obj["project_id"], f"{path}.project_id", minimum=0)
    _optional_int(obj["repository_size"], f"{path}.repository_size")


# --------------------------------------------------------------------------- #
# Small typed helpers
# --------------------------------------------------------------------------- #


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"string {json.dumps(text)}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _one_of(value: Any, path: str, allowed: tuple[str, ...]) -> str:
    """One of ``allowed`` (absent or null: the first, the default)."""
    if value is None:
        return allowed[0]
    if value not in allowed:
        raise ScenarioError(path, f"must be one of {', '.join(allowed)}, got {_show(value)}")
    return value


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(path, f"expected an object, got {_show(value)}")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise ScenarioError(path, f"expected an array, got {_show(value)}")
    return value


def _known_keys(
    obj: dict[str, Any], path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()
) -> None:
    for key in required:
        if key not in obj:
            raise ScenarioError(f"{path}.{key}" if path != ROOT else key, "is required")
    for key in obj:
        if key not in allowed:
            where = f"{path}.{key}" if path != ROOT else str(key)
            raise ScenarioError(where, "unknown field")


def _int(value: Any, path: str, *, minimum: int | None = None) -> int:
    if type(value) is not int:
        raise ScenarioError(path, f"expected an integer, got {_show(value)}")
    if minimum is not None and value < minimum:
        raise ScenarioError(path, f"must be at least {minimum}, got {value}")
    return value


def _optional_int(value: Any, path: str) -> int | None:
    """A byte count or counter that may be null: a non-negative integer."""
    if value is None:
        return None
    return _int(value, path, minimum=0)


def _positive_number(value: Any, path: str) -> int | float:
    if type(value) not in (int, float):
        raise ScenarioError(path, f"expected a number, got {_show(value)}")
    if not math.isfinite(value) or value <= 0:
        raise ScenarioError(path, f"must be greater than 0, got {value!r}")
    return value


def _factor_ratio(factor: int | float) -> tuple[int, int]:
    if type(factor) is int:
        return factor, 1
    return Fraction(repr(factor)).as_integer_ratio()
