"""Schema drift: the migrated database must match GitLab's Zoekt schema.

The expected schema is ``tests/fixtures/gitlab_zoekt_schema.json``, written by
hand from the reference (section 1), not generated from the database. Every
test here reads the real PostgreSQL test database through ``pg_catalog`` and
compares one aspect of one table with the fixture, so a failure names the
table, the aspect and every ``table.column`` that differs.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection

from zoekt import models as zoekt_models

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gitlab_zoekt_schema.json"
SCHEMA = json.loads(FIXTURE.read_text())
TABLES: dict[str, dict] = SCHEMA["tables"]
ENUMS: dict[str, dict] = SCHEMA["enums"]

ZOEKT_TABLES = [
    "zoekt_nodes",
    "zoekt_enabled_namespaces",
    "zoekt_replicas",
    "zoekt_indices",
    "zoekt_repositories",
    "zoekt_tasks",
]
CORE_TABLES = ["namespaces", "projects", "project_statistics", "namespace_root_storage_statistics"]

ON_DELETE = {"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}
PARTITION_STRATEGY = {"l": "LIST", "r": "RANGE", "h": "HASH"}


def tables_with(aspect: str) -> list:
    return [pytest.param(name, id=name) for name, spec in TABLES.items() if aspect in spec]


def fail_if(problems: list[str], table: str, aspect: str) -> None:
    if problems:
        pytest.fail(f"{table}: {aspect} drift from the reference\n  " + "\n  ".join(problems))


# ----------------------------------------------------------------------------
# Introspection (pg_catalog, current schema only)
# ----------------------------------------------------------------------------


def query(sql: str, params: list | tuple = ()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def table_oid(table: str) -> int | None:
    rows = query(
        "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relname = %s AND c.relkind IN ('r', 'p')",
        [table],
    )
    return rows[0][0] if rows else None


def require_table(table: str) -> int:
    oid = table_oid(table)
    if oid is None:
        pytest.fail(f"{table}: table does not exist in the database")
    return oid


def db_columns(oid: int) -> dict[str, dict]:
    rows = query(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity <> ''
        FROM pg_attribute a
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
        """,
        [oid],
    )
    return {
        name: {"type": type_, "nullable": nullable, "default": normalise_default(expr, identity)}
        for name, type_, nullable, expr, identity in rows
    }


def db_indexes(oid: int) -> list[dict]:
    """Every index of the table: name, ordered key columns, unique, primary."""
    rows = query(
        """
        SELECT ic.relname, i.indisunique, i.indisprimary, i.indexprs IS NOT NULL,
               i.indpred IS NOT NULL,
               ARRAY(SELECT a.attname
                     FROM unnest(i.indkey[0:i.indnkeyatts - 1]) WITH ORDINALITY AS k(attnum, n)
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                     ORDER BY k.n)
        FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
        WHERE i.indrelid = %s
        ORDER BY ic.relname
        """,
        [oid],
    )
    return [
        {
            "name": name,
            "unique": unique,
            "primary": primary,
            "expression": expr,
            "partial": partial,
            "columns": list(columns),
        }
        for name, unique, primary, expr, partial, columns in rows
    ]


def db_foreign_keys(oid: int) -> dict[str, dict]:
    rows = query(
        """
        SELECT con.conname, ARRAY(SELECT attname FROM pg_attribute
                                  WHERE attrelid = con.conrelid AND attnum = ANY (con.conkey)),
               ref.relname,
               ARRAY(SELECT attname FROM pg_attribute
                     WHERE attrelid = con.confrelid AND attnum = ANY (con.confkey)),
               con.confdeltype
        FROM pg_constraint con JOIN pg_class ref ON ref.oid = con.confrelid
        WHERE con.contype = 'f' AND con.conrelid = %s
        """,
        [oid],
    )
    keys = {}
    for name, columns, ref_table, ref_columns, rule in rows:
        keys[",".join(columns)] = {
            "name": name,
            "references": f"{ref_table}.{','.join(ref_columns)}",
            "on_delete": ON_DELETE[rule],
        }
    return keys


def db_checks(oid: int) -> dict[str, str]:
    rows = query(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE contype = 'c' AND conrelid = %s",
        [oid],
    )
    return dict(rows)


def db_partitioning(oid: int) -> dict | None:
    rows = query(
        """
        SELECT p.partstrat,
               ARRAY(SELECT a.attname
                     FROM unnest(p.partattrs::int2[]) WITH ORDINALITY AS k(attnum, n)
                     JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = k.attnum
                     ORDER BY k.n)
        FROM pg_partitioned_table p WHERE p.partrelid = %s
        """,
        [oid],
    )
    if not rows:
        return None
    strategy, columns = rows[0]
    return {"strategy": PARTITION_STRATEGY[strategy], "columns": list(columns)}


# ----------------------------------------------------------------------------
# Normalisation
# ----------------------------------------------------------------------------

_CAST = re.compile(r"::[a-z][a-z0-9_ ]*(\([0-9, ]*\))?(\[\])?$")


def normalise_default(expr: str | None, identity: bool = False) -> str | None:
    """``'{}'::jsonb`` -> ``{}``; identity/nextval -> ``sequence``; None stays None."""
    if identity:
        return "sequence"
    if expr is None:
        return None
    value = expr.strip()
    if value.startswith("nextval("):
        return "sequence"
    value = _CAST.sub("", value)
    if len(value) >= 2 and value[0] == "'" and value[-1] == "'":
        value = value[1:-1].replace("''", "'")
    return value


def same_default(expected: str | None, actual: str | None, type_: str) -> bool:
    if expected == actual:
        return True
    if expected is None or actual is None or not type_.startswith("timestamp"):
        return False
    try:  # timestamp literals: compare instants, whatever the session time zone printed
        return datetime.fromisoformat(expected) == datetime.fromisoformat(actual)
    except ValueError:
        return False


def normalise_check(definition: str) -> str:
    """Ignore PostgreSQL's parenthesisation and spacing when comparing CHECK bodies."""
    return " ".join(definition.replace("(", " ").replace(")", " ").split())


# ----------------------------------------------------------------------------
# The fixture itself
# ----------------------------------------------------------------------------


def test_fixture_covers_the_six_zoekt_tables_and_the_core_slice():
    assert set(TABLES) == set(ZOEKT_TABLES) | set(CORE_TABLES)
    for name in ZOEKT_TABLES:
        assert TABLES[name]["partial"] is False, f"{name} must pin every column"
        for aspect in (
            "columns",
            "primary_key",
            "unique",
            "foreign_keys",
            "checks",
            "indexed",
            "partitioning",
        ):
            assert aspect in TABLES[name], f"{name}: fixture lacks {aspect!r}"
    for name in CORE_TABLES:
        assert TABLES[name]["partial"] is True


def test_the_one_column_added_after_the_reference_baseline_says_so():
    """GitLab 19.0 added ``zoekt_nodes.webserver_last_seen_at`` after the reference's baseline."""
    column = TABLES["zoekt_nodes"]["columns"]["webserver_last_seen_at"]
    assert {key: column[key] for key in ("type", "nullable", "default")} == {
        "type": "timestamp with time zone",
        "nullable": True,
        "default": None,
    }
    assert "GitLab 19.0" in column["note"]
    assert "after the reference's baseline" in column["note"]
    assert any("webserver_last_seen_at" in line for line in SCHEMA["_about"])


# ----------------------------------------------------------------------------
# One test per aspect, parametrized by table
# ----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("table", tables_with("columns"))
def test_columns(table):
    """Type, nullability and default of every column; extra columns fail for zoekt tables."""
    spec = TABLES[table]
    actual = db_columns(require_table(table))
    problems = []
    for column, want in spec["columns"].items():
        have = actual.get(column)
        if have is None:
            problems.append(f"{table}.{column}: missing from the database (expected {want})")
            continue
        if have["type"] != want["type"]:
            problems.append(
                f"{table}.{column}: type expected {want['type']!r}, actual {have['type']!r}"
            )
        if have["nullable"] != want["nullable"]:
            problems.append(
                f"{table}.{column}: nullable expected {want['nullable']}, actual {have['nullable']}"
            )
        if not same_default(want["default"], have["default"], have["type"]):
            problems.append(
                f"{table}.{column}: default expected {want['default']!r}, "
                f"actual {have['default']!r}"
            )
    if not spec["partial"]:
        for column in actual.keys() - spec["columns"].keys():
            problems.append(
                f"{table}.{column}: in the database but not in the fixture "
                f"(actual {actual[column]})"
            )
    fail_if(problems, table, "columns")


@pytest.mark.django_db
@pytest.mark.parametrize("table", tables_with("primary_key"))
def test_primary_key(table):
    indexes = db_indexes(require_table(table))
    primary = [index["columns"] for index in indexes if index["primary"]]
    want = TABLES[table]["primary_key"]
    if primary != [want]:
        pytest.fail(
            f"{table}: primary key expected ({', '.join(want)}), actual {primary or 'none'}"
        )


@pytest.mark.django_db
@pytest.mark.parametrize("table", tables_with("unique"))
def test_unique(table):
    """Unique constraints and unique indexes as column lists (exact set for zoekt tables)."""
    spec = TABLES[table]
    indexes = db_indexes(require_table(table))
    actual = {
        tuple(index["columns"]): index
        for index in indexes
        if index["unique"] and not index["primary"]
    }
    expected = [tuple(entry["columns"]) for entry in spec["unique"]]
    partial = {tuple(entry["columns"]) for entry in spec["unique"] if entry.get("partial")}
    problems = []
    for columns in expected:
        index = actual.get(columns)
        if index is None:
            problems.append(
                f"{table}.({', '.join(columns)}): unique expected, none in the database"
            )
        elif columns in partial:
            if not index["partial"]:
                problems.append(
                    f"{table}.({', '.join(columns)}): unique index {index['name']} should be "
                    "partial (the fixture says so)"
                )
        elif index["partial"] or index["expression"]:
            problems.append(
                f"{table}.({', '.join(columns)}): unique index {index['name']} is partial or "
                "on an expression; expected a plain unique"
            )
    if not spec["partial"]:
        for columns in actual.keys() - set(expected):
            problems.append(
                f"{table}.({', '.join(columns)}): unique {actual[columns]['name']} in the "
                "database but not in the fixture"
            )
    fail_if(problems, table, "unique")


@pytest.mark.django_db
@pytest.mark.parametrize("table", tables_with("foreign_keys"))
def test_foreign_keys(table):
    """Every foreign key: referenced table and ON DELETE rule (exact set, all tables)."""
    expected = TABLES[table]["foreign_keys"]
    actual = db_foreign_keys(require_table(table))
    problems = []
    for column, want in expected.items():
        have = actual.get(column)
        if have is None:
            problems.append(
                f"{table}.{column}: FK -> {want['references']} ON DELETE {want['on_delete']} "
                "expected, none in the database"
            )
            continue
        if have["references"] != want["references"]:
            problems.append(
                f"{table}.{column}: FK references expected {want['references']}, "
                f"actual {have['references']}"
            )
        if have["on_delete"] != want["on_delete"]:
            problems.append(
                f"{table}.{column}: ON DELETE expected {want['on_delete']}, "
                f"actual {have['on_delete']} ({have['name']})"
            )
    for column in actual.keys() - expected.keys():
        have = actual[column]
        problems.append(
            f"{table}.{column}: FK {have['name']} -> {have['references']} ON DELETE "
            f"{have['on_delete']} in the database but not in the fixture"
        )
    fail_if(problems, table, "foreign keys")


@pytest.mark.django_db
@pytest.mark.parametrize("table", tables_with("checks"))
def test_checks(table):
    expected = TABLES[table]["checks"]
    actual = db_checks(require_table(table))
    problems = []
    for name, want in expected.items():
        have = actual.get(name)
        if have is None:
            problems.append(f"{table}.{name}: CHECK expected ({want}), none in the database")
        elif normalise_check(have) != normalise_check(want):
            problems.append(f"{table}.{name}: expected {want!r}, actual {have!r}")
    for name in actual.keys() - expected.keys():
        problems.append(f"{table}.{name}: {actual[name]} in the database but not in the fixture")
    fail_if(problems, table, "CHECK constraints")


@pytest.mark.django_db
@pytest.mark.parametrize("table", tables_with("indexed"))
def test_indexed_columns(table):
    """Columns the reference calls indexed lead at least one index."""
    indexes = db_indexes(require_table(table))
    leading = {index["columns"][0] for index in indexes if index["columns"]}
    problems = [
        f"{table}.{column}: expected to lead an index, none does"
        for column in TABLES[table]["indexed"]
        if column not in leading
    ]
    fail_if(problems, table, "indexed columns")


@pytest.mark.django_db
@pytest.mark.parametrize("table", tables_with("indexes"))
def test_named_indexes(table):
    """The reference's indexes, by name and columns; no other non-unique index."""
    expected = TABLES[table]["indexes"]
    actual = {
        index["name"]: index["columns"]
        for index in db_indexes(require_table(table))
        if not index["unique"]
    }
    problems = []
    for name, columns in expected.items():
        if name not in actual:
            problems.append(f"{table}.{name}: index on ({', '.join(columns)}) expected, missing")
        elif actual[name] != columns:
            problems.append(f"{table}.{name}: columns expected {columns}, actual {actual[name]}")
    for name in actual.keys() - expected.keys():
        problems.append(
            f"{table}.{name}: index on ({', '.join(actual[name])}) in the database "
            "but not in the fixture"
        )
    fail_if(problems, table, "indexes")


@pytest.mark.django_db
@pytest.mark.parametrize("table", tables_with("partitioning"))
def test_partitioning(table):
    want = TABLES[table]["partitioning"]
    have = db_partitioning(require_table(table))
    if have != want:
        pytest.fail(f"{table}: partitioning expected {want}, actual {have}")


# ----------------------------------------------------------------------------
# Enum values: fixture (reference) vs the Django model choices
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("enum", [pytest.param(key, id=key) for key in ENUMS])
def test_enum_values(enum):
    spec = ENUMS[enum]
    model = getattr(zoekt_models, spec["model"])
    choices = getattr(model, spec["choices"])
    actual = {label: value for value, label in choices.choices}
    problems = []
    for name, value in spec["values"].items():
        if name not in actual:
            problems.append(
                f"{enum}: {name} = {value} expected, missing from {choices.__qualname__}"
            )
        elif actual[name] != value:
            problems.append(f"{enum}: {name} expected {value}, actual {actual[name]}")
    for name in actual.keys() - spec["values"].keys():
        problems.append(f"{enum}: {name} = {actual[name]} in {choices.__qualname__}, not in GitLab")

    field = model._meta.get_field(spec["field"])
    field = getattr(field, "base_field", field)  # ArrayField (services): its element's choices
    if list(field.choices or []) != list(choices.choices):
        problems.append(
            f"{enum}: {spec['model']}.{spec['field']} does not use {choices.__qualname__} "
            f"as its choices (actual {field.choices})"
        )
    fail_if(problems, enum.split(".")[0], "enum values")
