"""config.procrun: which demo process prints on the terminal and which writes a log file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from config import devservers
from config.procrun import log_destinations, process_type

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_demo_keeps_the_driver_and_the_traffic_on_the_terminal_and_logs_the_rest():
    names = ["web.1", "worker.1", "beat.1", "nodes.1", "drive.1", "traffic.1"]
    logs = Path("/x/var/log")
    assert log_destinations(names, devservers.DEMO_TERMINAL, logs) == {
        "web.1": logs / "web.log",
        "worker.1": logs / "worker.log",
        "beat.1": logs / "beat.log",
        "nodes.1": logs / "nodes.log",
        "drive.1": None,
        "traffic.1": None,
    }


def test_without_a_log_dir_everything_is_on_the_terminal():
    assert log_destinations(["web.1", "drive.1"], ["drive"], None) == {
        "web.1": None,
        "drive.1": None,
    }


def test_a_full_process_name_may_be_named_and_two_of_a_type_share_its_file():
    logs = Path("logs")
    assert log_destinations(["web.1", "web.2", "worker.1"], ["web.2"], logs) == {
        "web.1": logs / "web.log",
        "web.2": None,
        "worker.1": logs / "worker.log",
    }
    assert [process_type(n) for n in ("web.1", "drive", "a.b.12")] == ["web", "drive", "a.b"]


def test_the_demo_names_only_procfile_types():
    types = {
        line.split(":", 1)[0]
        for line in (ROOT / "Procfile.demo").read_text().splitlines()
        if line.strip()
    }
    assert set(devservers.DEMO_TERMINAL) <= types
    assert types - set(devservers.DEMO_TERMINAL) == {"web", "worker", "beat", "nodes"}


def test_the_lines_go_where_they_are_routed(tmp_path):
    procfile = tmp_path / "Procfile"
    # "loud" prints many lines (as the access log does) and keeps running; "shown" prints
    # one and exits, which stops the other as honcho does.
    procfile.write_text(
        "loud: for i in 1 2 3; do echo loud-line-$i; done; sleep 30\n"
        "shown: sleep 1; echo shown-line; sleep 0.5\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "config.procrun",
            str(procfile),
            "--log-dir",
            str(tmp_path / "log"),
            "--terminal",
            "shown",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "shown.1 | shown-line" in done.stdout
    assert "loud-line" not in done.stdout
    assert "loud.1 started" in done.stdout  # honcho's own lines stay on the terminal
    logged = (tmp_path / "log" / "loud.log").read_text()
    assert [line.split("| ", 1)[1] for line in logged.splitlines()] == [
        "loud-line-1",
        "loud-line-2",
        "loud-line-3",
    ]
    assert not (tmp_path / "log" / "shown.log").exists()
