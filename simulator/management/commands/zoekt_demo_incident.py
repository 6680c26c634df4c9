"""``manage.py zoekt_demo_incident spike|overfill|hot|drain``: an incident on a running demo.

Run it in a second terminal once ``make demo`` has converged (from the
checkout: ``.venv/bin/python -m config.devservers exec -- .venv/bin/python
manage.py zoekt_demo_incident spike``). It prints what it did, which settings
it changed, what to watch on the dashboard, a progress line every few
seconds, and when the incident is over; then it puts the settings and the
fake node back. ``simulator.demoincidents`` says what each incident does.
Ctrl-C ends it early, putting everything back the same way.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

from django.conf import settings as django_settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from simulator.demoincidents import (
    INCIDENTS,
    IncidentError,
    dark_namespaces,
    make_incident,
    run_incident_pass,
)

#: Procfile.demo's ``--state-dir`` for the fake nodes, from the checkout.
STATE_DIR = Path(django_settings.BASE_DIR) / "var" / "fakenodes"


class Command(BaseCommand):
    help = "Demo: make a disk spike, an overfill, a hot namespace or a drain happen on make demo."

    def add_arguments(self, parser):
        parser.add_argument("incident", choices=INCIDENTS)
        parser.add_argument("--node", default=None, help="node id or name (the command picks)")
        parser.add_argument(
            "--namespace", type=int, default=None, help="hot: the root namespace id that grows"
        )
        parser.add_argument(
            "--state-dir",
            type=Path,
            default=STATE_DIR,
            help="the fake nodes' --state-dir, where their override files go (var/fakenodes)",
        )
        parser.add_argument("--pass-every", type=float, default=2.0, metavar="SECONDS")
        parser.add_argument("--report-every", type=float, default=6.0, metavar="SECONDS")
        parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS")

    def handle(self, *args, **options):
        if options["pass_every"] <= 0 or options["timeout"] <= 0:
            raise CommandError("--pass-every and --timeout must be > 0 seconds")
        if options["namespace"] is not None and options["incident"] != "hot":
            raise CommandError("--namespace is for the hot incident only")
        try:
            incident = make_incident(
                options["incident"], options["state_dir"], options["node"], options["namespace"]
            )
        except IncidentError as error:
            raise CommandError(str(error)) from error
        # The jobs it runs log a line each; the [incident] lines say what they did.
        logging.getLogger().setLevel(logging.WARNING)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda _s, _f: stop.set())
        say = self._say
        try:
            for line in incident.begin():
                say(line)
            over = self._loop(incident, options, stop)
            for line in incident.summary() if over else ():
                say(line)
            if not over:
                say(
                    "stopped before the incident was over"
                    if stop.is_set()
                    else f"not over after {options['timeout']:g} s"
                )
        except IncidentError as error:
            raise CommandError(str(error)) from error
        finally:
            close_old_connections()
            for line in incident.finish():
                say(line)

    def _loop(self, incident, options, stop: threading.Event) -> bool:
        started = last_report = time.monotonic()
        ever_dark: set[int] = set()
        over = False
        while not over and not stop.is_set():
            close_old_connections()
            try:
                results = run_incident_pass()
            except Exception as exc:  # one failed pass must not end it: the next retries
                self._say(f"pass failed: {exc.__class__.__name__}: {exc}")
                results = {}
            dark = dark_namespaces()
            ever_dark |= dark
            over, line = incident.check(results)
            now = time.monotonic()
            if over or now - last_report >= options["report_every"]:
                last_report = now
                self._say(f"{int(now - started)} s: {line}; dark namespaces now {len(dark)}")
            if now - started >= options["timeout"]:
                break
            if not over:
                stop.wait(options["pass_every"])
        self._say(
            f"namespaces with no search target at some pass: {len(ever_dark)}"
            + (f" ({', '.join(map(str, sorted(ever_dark)))})" if ever_dark else "")
        )
        return over

    def _say(self, line: str) -> None:
        self.stdout.write(f"[incident] {line}")
        self.stdout.flush()
