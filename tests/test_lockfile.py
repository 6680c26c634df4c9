"""The locks hold what pyproject.toml asks for, every file with its hash.

``requirements.lock`` pins the runtime dependencies (``[project.dependencies]``) and
everything they pull in; ``requirements-dev.lock`` pins the same versions plus the
``embedded``, ``run`` and ``dev`` extras. ``make install``, the Dockerfile and CI (which runs
``make test``, hence ``make install``) install from them with ``--require-hashes``. A
dependency added to pyproject.toml without ``make lock`` fails here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def parse_lock(text: str) -> dict[str, tuple[str, int]]:
    """{canonical name: (version, number of sha256 hashes)} of a pip-compile lock."""
    pins: dict[str, tuple[str, int]] = {}
    current = None
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            pins[current] = (match.group(2), 0)
        if current is not None and not line.lstrip().startswith("#"):
            hashes = len(HASH.findall(line))
            if hashes:
                version, count = pins[current]
                pins[current] = (version, count + hashes)
        if not line.strip() or line.lstrip().startswith("#"):
            current = None if not line.strip() else current
    return pins


def lock_problems(requirements: list[str], pins: dict[str, tuple[str, int]]) -> list[str]:
    """What a lock lacks for these requirements: a package not pinned, a pin outside the
    requirement's range, a pin without a hash."""
    problems = []
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{requirement.name}: not in the lock")
            continue
        version, hashes = pins[name]
        if not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name}: locked {version}, pyproject asks {text}")
        if hashes == 0:
            problems.append(f"{requirement.name}: no hash")
    return problems


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def read_lock(name: str) -> dict[str, tuple[str, int]]:
    return parse_lock((ROOT / name).read_text())


def test_every_runtime_dependency_is_pinned_with_hashes_in_the_runtime_lock():
    assert lock_problems(project()["dependencies"], read_lock("requirements.lock")) == []


def test_every_extra_is_pinned_with_hashes_in_the_development_lock():
    extras = project()["optional-dependencies"]
    wanted = [req for name in ("embedded", "run", "dev") for req in extras[name]]
    dev = read_lock("requirements-dev.lock")
    assert lock_problems([*project()["dependencies"], *wanted], dev) == []


def test_every_pin_of_both_locks_has_a_hash():
    for name in ("requirements.lock", "requirements-dev.lock"):
        unhashed = [pkg for pkg, (_, hashes) in read_lock(name).items() if hashes == 0]
        assert unhashed == [], name


def test_the_development_lock_runs_the_runtime_locks_versions():
    runtime, dev = read_lock("requirements.lock"), read_lock("requirements-dev.lock")
    differing = {
        name: (version, dev.get(name, ("missing",))[0])
        for name, (version, _) in runtime.items()
        if dev.get(name, ("missing",))[0] != version
    }
    assert differing == {}


@pytest.mark.parametrize(
    ("requirement", "lock", "problem"),
    [
        ("Django>=5.2,<5.3", "", "Django: not in the lock"),
        (
            "Django>=5.2,<5.3",
            "django==5.1.4 \\\n    --hash=sha256:" + "a" * 64,
            "Django: locked 5.1.4",
        ),
        ("Django>=5.2,<5.3", "django==5.2.19\n", "Django: no hash"),
    ],
    ids=["missing", "out-of-range", "unhashed"],
)
def test_the_check_fails_on_a_lock_that_disagrees(requirement, lock, problem):
    problems = lock_problems([requirement], parse_lock(lock))
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_install_the_image_and_ci_install_from_the_locks_with_hashes():
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r requirements.lock -r requirements-dev.lock" in makefile
    assert "--no-deps -e ." in makefile
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --require-hashes -r requirements.lock" in dockerfile
    assert "pip install --no-deps ." in dockerfile
    assert "make test" in (ROOT / ".ci" / "run").read_text()
