"""Every environment variable the project reads is read in one place and documented.

The settings module reads the deployment's variables; the launcher of the
embedded servers reads the few it needs before Django starts; the Procfiles
read the process counts. Nothing else in the product reads the environment,
and every variable read is in the README's table and in ``.env.example``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.layering import PRODUCT

ROOT = Path(__file__).resolve().parents[2]
#: The files that may touch ``os.environ``: the settings, the embedded servers' launcher, and
#: the Procfile runner, which hands the environment on to the processes it starts.
READERS = ("config/settings.py", "config/devservers.py", "config/procrun.py")
#: Calls whose first argument names a variable the settings read.
READING_CALLS = {
    "get",
    "getenv",
    "env_str",
    "env_bool",
    "env_list",
    "env_int",
    "proxy_ssl_header",
    "_read_secret_files",
}


def variables_read(path: Path) -> set[str]:
    """The variable names ``path`` reads: ``os.environ.get("X")``, ``env_str("X")``,
    ``os.environ["X"]``, ``env.get("X")`` on a copy of the environment."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                name in READING_CALLS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.isupper()
            ):
                found.add(first.value)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            value = node.slice.value
            target = node.value
            if isinstance(value, str) and value.isupper() and ast.unparse(target) == "os.environ":
                found.add(value)
    return found


def procfile_variables() -> set[str]:
    names = set()
    for procfile in ("Procfile", "Procfile.demo"):
        names |= set(re.findall(r"\$\{([A-Z_]+):-", (ROOT / procfile).read_text()))
    return names


def readme_table_variables() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names |= set(re.findall(r"`([A-Z_]+)`", first_cell))
    return names


def env_example_variables() -> set[str]:
    return set(re.findall(r"^# ([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))


#: Names read that are not settings: what the launcher passes on to what it starts, and
#: a dictionary key the AST reading cannot tell from a variable.
NOT_SETTINGS = {"PATH", "XDG_RUNTIME_DIR", "NAME"}


def all_variables() -> set[str]:
    names = set().union(*(variables_read(ROOT / reader) for reader in READERS))
    return (names - NOT_SETTINGS) | procfile_variables()


def undocumented(read: set[str], documented: set[str]) -> list[str]:
    """``NAME_FILE`` is documented with ``NAME`` (the README's ``_FILE`` rule)."""
    return sorted(
        name
        for name in read - documented - {"DJANGO_SETTINGS_MODULE"}
        if not (name.endswith("_FILE") and name.removesuffix("_FILE") in documented)
    )


def test_the_readers_find_the_variables_the_issue_named():
    assert {
        "CELERY_QUEUE",
        "DATABASE_TEST_NAME",
        "DJANGO_CSRF_TRUSTED_ORIGINS",
        "DJANGO_STATIC_ROOT",
        "ZOEKT_BENCH_ENDPOINTS",
        "ZOEKT_VAR_DIR",
        "ZOEKT_CLOCK_OFFSET_SECONDS",
        "WEB_BIND",
    } <= all_variables()


@pytest.mark.parametrize(
    ("documented", "where"),
    [(readme_table_variables, "README.md"), (env_example_variables, ".env.example")],
    ids=["readme", "env-example"],
)
def test_every_variable_read_is_documented(documented, where):
    assert undocumented(all_variables(), documented()) == [], f"read but not in {where}"


def test_no_documented_variable_is_stale():
    stale = sorted(readme_table_variables() - all_variables() - {"DJANGO_SETTINGS_MODULE"})
    assert stale == []


def test_nothing_else_in_the_product_reads_the_environment():
    readers = []
    for package in sorted(PRODUCT | {"config"}):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in READERS:
                continue
            text = path.read_text()
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and ast.unparse(node) in (
                    "os.environ",
                    "os.getenv",
                ):
                    # Naming the settings module for Django is not reading a setting.
                    line = text.splitlines()[node.lineno - 1]
                    if "DJANGO_SETTINGS_MODULE" not in line:
                        readers.append(f"{relative}:{node.lineno}")
    assert readers == []


def test_the_check_sees_a_variable_read_in_a_module(tmp_path):
    module = tmp_path / "reader.py"
    module.write_text('import os\nA = os.environ.get("SOMETHING_NEW", "1")\nB = env_str("OTHER")\n')
    assert variables_read(module) == {"SOMETHING_NEW", "OTHER"}
