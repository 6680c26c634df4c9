"""The benchmarks' scratch databases: named after ``DATABASE_URL``'s, dropped and made again."""

from __future__ import annotations

import os
import sys
from urllib.parse import urlsplit, urlunsplit

import psycopg


def scratch_database_url(url: str, suffix: str) -> tuple[str, str]:
    """The URL and name of the scratch database ``<url's database>_<suffix>``."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/") + f"_{suffix}"
    return urlunsplit(parts._replace(path=f"/{name}")), name


def recreate_database(url: str, name: str) -> None:
    parts = urlsplit(url)
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(suffix: str, *, log_level: str = "WARNING") -> tuple[str, str]:
    """Point Django at a fresh, migrated scratch database; returns its URL and name."""
    url, name = scratch_database_url(os.environ["DATABASE_URL"], suffix)
    print(f"scratch database {name}", file=sys.stderr)
    recreate_database(url, name)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", log_level)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return url, name


def after_copy(url: str, cursor, tables: tuple[str, ...]) -> None:
    """After rows were COPYed with their ids: move the tables' id sequences past them, and
    analyse, so the benchmark's queries are planned on the real row counts."""
    for table in tables:
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
        )
    cursor.connection.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
