"""Run a Procfile's processes (honcho's manager), some on the terminal, the others to files.

``python -m config.procrun PROCFILE --log-dir var/log --terminal drive,traffic``
starts every process of ``PROCFILE`` as ``honcho start`` does (one stops,
all stop; Ctrl-C and SIGTERM stop them all) and prints, with honcho's
``time name |`` prefix, the lines of the processes named by ``--terminal``
and honcho's own (started, stopped). Every other process writes to
``<log-dir>/<type>.log`` (``web.log``, ``worker.log``, ...), emptied at each
start, the same prefix without colours. Without ``--log-dir`` everything goes
to the terminal, as ``honcho start`` would.

``make demo`` runs ``Procfile.demo`` this way (``config.devservers``): the
driver's and the traffic generator's lines on the terminal, the web server's
access log, the worker's, beat's and the fake nodes' in ``var/log/``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO

from honcho.environ import expand_processes, parse_procfile
from honcho.manager import Manager
from honcho.printer import Printer


def process_type(name: str) -> str:
    """``web`` for honcho's process name ``web.1``."""
    return name.rsplit(".", 1)[0] if name.rsplit(".", 1)[-1].isdigit() else name


def log_destinations(
    names: Iterable[str], terminal: Iterable[str], log_dir: Path | None
) -> dict[str, Path | None]:
    """Per process name (``web.1``): its log file, or None for the terminal.

    A process goes to the terminal when its type (or its full name) is in
    ``terminal``, or when there is no ``log_dir``; else to ``<log_dir>/<type>.log``.
    """
    shown = set(terminal)
    out: dict[str, Path | None] = {}
    for name in names:
        kind = process_type(name)
        if log_dir is None or kind in shown or name in shown:
            out[name] = None
        else:
            out[name] = log_dir / f"{kind}.log"
    return out


class RoutingPrinter(Printer):
    """honcho's printer, but the lines of some processes go to their own file."""

    def __init__(self, output: IO[str], files: Mapping[str, IO[str]], **kwargs) -> None:
        super().__init__(output, **kwargs)
        self.files = dict(files)
        self._file_printers = {
            name: Printer(handle, colour=False, prefix=kwargs.get("prefix", True))
            for name, handle in self.files.items()
        }

    def write(self, message) -> None:
        printer = self._file_printers.get(message.name)
        if printer is None:
            super().write(message)
            return
        printer.width = self.width
        printer.write(message)


def run(procfile: Path, log_dir: Path | None, terminal: Iterable[str], out: IO[str]) -> int:
    """Start every process of ``procfile`` until one stops; returns honcho's return code."""
    processes = expand_processes(parse_procfile(procfile.read_text()).processes)
    destinations = log_destinations([p.name for p in processes], terminal, log_dir)
    with contextlib.ExitStack() as stack:
        handles: dict[Path, IO[str]] = {}
        files: dict[str, IO[str]] = {}
        for name, path in destinations.items():
            if path is None:
                continue
            if path not in handles:
                path.parent.mkdir(parents=True, exist_ok=True)
                handles[path] = stack.enter_context(path.open("w", buffering=1))
            files[name] = handles[path]
        manager = Manager(RoutingPrinter(out, files))
        for params in processes:
            manager.add_process(
                params.name, params.cmd, quiet=params.quiet, env={**os.environ, **params.env}
            )
        manager.loop()
        return manager.returncode or 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m config.procrun", description=__doc__)
    parser.add_argument("procfile", type=Path)
    parser.add_argument("--log-dir", type=Path, default=None, help="where the other logs go")
    parser.add_argument(
        "--terminal",
        default="",
        help="comma-separated process types whose lines stay on the terminal",
    )
    args = parser.parse_args(argv)
    terminal = [name for name in args.terminal.split(",") if name]
    return run(args.procfile, args.log_dir, terminal, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
