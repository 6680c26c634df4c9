"""The image's build steps, replayed without a container daemon.

The Dockerfile copies the build context that ``.dockerignore`` leaves, installs
the locked dependencies (``requirements.lock``, hashes required) and the project
(``pip install --no-deps .``, which packages what ``pyproject.toml``'s
``packages.find`` includes) and runs ``collectstatic``. Here the context is
copied the same way into a temporary folder, the packages the install would
take are found with setuptools' own finder, and the ``collectstatic`` line runs
as the Dockerfile gives it, against the copied folder alone (site-packages for
the dependencies, none of this checkout's editable install), so an app the
image would miss fails the test as it would fail the build.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from django.conf import settings
from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined."""
    joined = text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def ignore_patterns(text: str) -> list[str]:
    return [
        line.strip().rstrip("/")
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether ``.dockerignore`` leaves ``relative`` (or a folder above it) out."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        anywhere = pattern.startswith("**/")
        bare = pattern[3:] if anywhere else pattern
        for prefix in prefixes:
            name = prefix.rpartition("/")[2] if anywhere else prefix
            if fnmatch.fnmatchcase(name, bare):
                return True
    return False


def build_context(root: Path, destination: Path) -> Path:
    """Copy what ``COPY . .`` would copy: the tree less ``.dockerignore``'s patterns."""
    patterns = ignore_patterns((root / ".dockerignore").read_text())
    for folder, dirs, files in os.walk(root):
        here = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if not ignored((here / d).as_posix(), patterns)]
        for name in files:
            relative = (here / name).as_posix()
            if not ignored(relative, patterns):
                target = destination / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(folder) / name, target)
    return destination


@pytest.fixture(scope="module")
def image_root(tmp_path_factory):
    """The image's /app after its COPY instructions."""
    instructions = dockerfile_instructions((ROOT / "Dockerfile").read_text())
    copies = [arguments for keyword, arguments in instructions if keyword == "COPY"]
    assert copies == [". ."], "the image copies its whole build context, in one step"
    return build_context(ROOT, tmp_path_factory.mktemp("app"))


def local_apps() -> list[str]:
    return [app for app in settings.INSTALLED_APPS if (ROOT / app / "__init__.py").exists()]


def test_the_context_holds_every_installed_app_and_the_wiring(image_root):
    for package in [*local_apps(), settings.ROOT_URLCONF.partition(".")[0], "templates"]:
        assert (image_root / package).is_dir(), package
    assert (image_root / "manage.py").is_file()
    assert not (image_root / "tests").exists()
    assert not (image_root / "var").exists()


def test_the_install_step_packages_every_installed_app_and_the_wiring(image_root):
    found = tomllib.loads((image_root / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = found["packages"]["find"]["include"]
    packaged = set(find_packages(where=str(image_root), include=include))
    wiring = {settings.ROOT_URLCONF.rpartition(".")[0], settings.WSGI_APPLICATION.split(".")[0]}
    missing = sorted({*local_apps(), *wiring} - packaged)
    assert missing == []


def replay_collectstatic(image_root: Path, scratch: Path) -> subprocess.CompletedProcess:
    """The Dockerfile's collectstatic line, run in ``image_root`` with its environment.

    ``python`` is this interpreter without site initialisation, so the checkout's
    editable install cannot stand in for a package the copy left out."""
    instructions = dockerfile_instructions((ROOT / "Dockerfile").read_text())
    (run,) = [
        arguments
        for keyword, arguments in instructions
        if keyword == "RUN" and "collectstatic" in arguments
    ]
    steps = [step.strip() for step in run.split("&&")]
    assert steps[:2] == [
        "pip install --require-hashes -r requirements.lock",
        "pip install --no-deps .",
    ]
    assert (image_root / "requirements.lock").is_file()
    shim = scratch / "bin"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S "$@"\n')
    (shim / "python").chmod(0o755)
    env = {
        "PATH": f"{shim}:/usr/bin:/bin",
        "PYTHONPATH": f"{image_root}:{sysconfig.get_paths()['purelib']}",
        "HOME": str(scratch),
    }
    return subprocess.run(
        ["sh", "-c", steps[2].replace("/app/static", str(scratch / "static"))],
        cwd=image_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_collectstatic_step_runs_on_the_copied_tree_alone(image_root, tmp_path):
    done = replay_collectstatic(image_root, tmp_path)

    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "static" / "admin").is_dir()


def test_the_replay_fails_when_an_app_is_left_out(tmp_path):
    """The check can fail: the build of a context without the dashboard app fails."""
    context = build_context(ROOT, tmp_path / "app")
    shutil.rmtree(context / "dashboard")

    done = replay_collectstatic(context, tmp_path / "scratch")

    assert done.returncode != 0
    assert "No module named 'dashboard'" in done.stderr


@pytest.mark.parametrize(
    ("path", "left_out"),
    [
        ("var/postgres/data/PG_VERSION", True),
        ("planner/__pycache__/core.cpython-311.pyc", True),
        ("tests/test_image.py", True),
        ("zoekt_control.egg-info/PKG-INFO", True),
        ("planner/core.py", False),
        ("templates/dashboard/fleet.html", False),
        ("pyproject.toml", False),
    ],
)
def test_the_ignore_patterns_leave_out_local_state_and_keep_the_source(path, left_out):
    patterns = ignore_patterns((ROOT / ".dockerignore").read_text())
    assert ignored(path, patterns) is left_out
