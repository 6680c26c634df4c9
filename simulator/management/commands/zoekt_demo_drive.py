"""Drive ``make demo`` until every enabled namespace has a ready replica, then idle.

``Procfile.demo`` runs this next to the web server, worker, beat and the fake
nodes. It

1. waits until ``--nodes`` nodes are online (the fake nodes register with
   their first heartbeat, a few seconds after the web server is up), or
   ``--wait-nodes-timeout`` seconds, after which it goes on with the nodes it
   has and says so;
2. runs a rollout in this process (``planner.tasks.rollout_task`` called
   directly) and, while an enabled namespace still has no replica, another
   every ``--rollout-every`` seconds (a rollout plans only over the nodes
   online when it runs; what it could not place, the next one places);
3. every ``--kick-every`` seconds runs one scheduling pass in this process:
   each scheduled task of ``zoekt.scheduling.service.TASKS`` through
   ``run_scheduled_task(name)`` called directly. This is the demo's speed-up.
   Beat runs the same pass once a minute, and ``initial_indexing`` starts
   ``zoekt_initial_indexing_limit`` pending indices per online node per pass
   (the demo keeps GitLab's default, 1), so a node that was given twenty
   indices needs twenty passes: twenty minutes at beat's pace, under a minute
   at this one. (Raising the limit instead, beat alone would need a few
   passes, minutes rather than the driver's seconds.) Each task takes its
   own advisory lock, so a pass that meets beat's (or the worker's) run of
   the same task skips it, as two beat ticks would;
4. prints a progress line every ``--report-every`` seconds and, once every
   enabled namespace has a ready replica, how long that took and how many
   indices each node holds, then the dashboard's admin user and the command that
   sets a new password for it. It then stops kicking and sleeps, printing a line
   only when the counts change, until SIGTERM or SIGINT, and exits 0 (honcho
   stops every process as soon as one exits, so it must keep running).

``DemoDriver.tick`` is one pass of the loop at a given monotonic time and
returns how long to sleep; the command only sleeps and calls it again. The
process logs at WARNING (``--log-level``), so the structured records of the
rollouts and tasks it runs in-process stay out of the demo's output; the
rollout plans are still kept for the dashboard, and the worker logs the jobs
they enqueue.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from simulator.demoprogress import DemoProgress, demo_progress

DASHBOARD_URL = "http://127.0.0.1:8000/admin/dashboard/"
# Index states shown in the progress line even at zero; others only when present.
SHOWN_INDEX_STATES = ("pending", "in_progress", "initializing", "ready")
# How often a converged driver looks at the counts again.
IDLE_CHECK_SECONDS = 10.0
WAIT_POLL_SECONDS = 1.0
WAIT_REPORT_SECONDS = 3.0


class Phase(enum.StrEnum):
    WAITING = "waiting"
    DRIVING = "driving"
    CONVERGED = "converged"


def run_scheduling_pass() -> list[dict]:
    """Every scheduled task once, in this process, as beat's tick would enqueue them."""
    from zoekt.scheduling.service import TASKS
    from zoekt.scheduling.tasks import run_scheduled_task

    return [run_scheduled_task(name) for name in TASKS]


# In a second terminal, from the checkout: the demo's embedded servers are joined, not started.
IN_DEMO = ".venv/bin/python -m config.devservers exec -- .venv/bin/python manage.py"


def sign_in_lines() -> list[str]:
    """Who signs in to the dashboard and how to give it a new password (printed at
    convergence: the password itself was printed once, minutes of output earlier)."""
    from django.contrib.auth import get_user_model

    admin = (
        get_user_model()
        .objects.filter(is_superuser=True, is_active=True)
        .order_by("id")
        .values_list("username", flat=True)
        .first()
    )
    if admin is None:
        return [f"no admin user: create one with {IN_DEMO} createsuperuser"]
    return [
        f"sign in as {admin!r} (its password was printed once, when it was created); "
        f"to set a new one: {IN_DEMO} changepassword {admin}",
        f"try an incident in a second terminal: {IN_DEMO} zoekt_demo_incident "
        "spike|overfill|hot|drain",
    ]


def run_rollout() -> dict:
    from planner.tasks import rollout_task

    return rollout_task()


def clock_text(seconds: float) -> str:
    """``m:ss``."""
    whole = max(int(seconds), 0)
    return f"{whole // 60}:{whole % 60:02d}"


def progress_text(progress: DemoProgress, expected_nodes: int) -> str:
    indices = progress.indices
    shown = [
        f"{name} {count}" for name, count in indices.items() if name in SHOWN_INDEX_STATES or count
    ]
    return (
        f"nodes {progress.nodes_online}/{max(expected_nodes, progress.nodes)} online  "
        f"namespaces ready {progress.namespaces_ready}/{progress.enabled_namespaces}  "
        f"indices {' · '.join(shown)}  "
        f"repositories ready {progress.repositories_ready}/{progress.repositories}"
    )


def rollout_text(summary: Any) -> str:
    if not isinstance(summary, dict):
        return str(summary)
    if "skipped" in summary:
        return f"skipped ({summary['skipped']})"
    parts = [str(summary.get("outcome", "?"))]
    if "namespaces_selected" in summary:
        parts.append(
            f"{summary['namespaces_selected']} namespaces over {summary['nodes_available']} nodes"
        )
    plan = summary.get("plan")
    if plan:
        parts.append(f"create {plan['create']}, failures {plan['failures']}")
    if summary.get("re_enqueue"):
        parts.append("continues in the worker")
    return "; ".join(parts)


@dataclasses.dataclass
class DemoDriver:
    """The loop of ``zoekt_demo_drive``; ``tick(now)`` runs one pass at monotonic time ``now``.

    ``rollout``, ``schedule`` and ``progress`` are injectable so tests can
    count calls and step a fake time without sleeping.
    """

    expected_nodes: int = 5
    wait_nodes_timeout: float = 120.0
    kick_every: float = 2.0
    rollout_every: float = 20.0
    report_every: float = 5.0
    dashboard_url: str = DASHBOARD_URL
    say: Callable[[str], None] = print
    rollout: Callable[[], Any] = run_rollout
    schedule: Callable[[], Any] = run_scheduling_pass
    progress: Callable[[], DemoProgress] = demo_progress
    sign_in: Callable[[], list[str]] = sign_in_lines

    phase: Phase = Phase.WAITING
    started_at: float | None = None
    converged_after: float | None = None
    last_rollout: float | None = None
    last_kick: float | None = None
    last_report: float | None = None
    last: DemoProgress | None = None
    rollouts: int = 0
    kicks: int = 0
    _idle_seen: tuple | None = None

    def _say(self, now: float, text: str) -> None:
        self.say(f"[demo] {clock_text(now - self.started_at)}  {text}")

    def tick(self, now: float) -> float:
        """One pass: wait for nodes, or drive, or idle. Returns the seconds to sleep."""
        if self.started_at is None:
            self.started_at = now
        if self.phase is Phase.WAITING:
            delay = self._wait(now)
            if self.phase is Phase.WAITING:
                return delay
        if self.phase is Phase.DRIVING:
            return self._drive(now)
        return self._idle(now)

    # --- phases -------------------------------------------------------------------------

    def _wait(self, now: float) -> float:
        progress = self.last = self.progress()
        online, expected = progress.nodes_online, self.expected_nodes
        if online >= expected:
            self._say(now, f"{online}/{expected} nodes online; rolling out")
            self.phase = Phase.DRIVING
        elif now - self.started_at >= self.wait_nodes_timeout:
            self._say(
                now,
                f"only {online} of {expected} nodes online after {self.wait_nodes_timeout:g} s; "
                "going on with them (later rollouts place namespaces on nodes that come later)",
            )
            self.phase = Phase.DRIVING
        elif self.last_report is None or now - self.last_report >= WAIT_REPORT_SECONDS:
            self._say(now, f"waiting for nodes: {online}/{expected} online")
            self.last_report = now
        return WAIT_POLL_SECONDS

    def _drive(self, now: float) -> float:
        lacking = self.last is None or self.last.namespaces_without_replica > 0
        if self.last_rollout is None or (lacking and now - self.last_rollout >= self.rollout_every):
            self.last_rollout = now
            self.rollouts += 1
            summary = self._guarded(now, "rollout", self.rollout)
            if summary is not None:
                self._say(now, f"rollout: {rollout_text(summary)}")
        if self.last_kick is None or now - self.last_kick >= self.kick_every:
            self.last_kick = now
            self.kicks += 1
            self._guarded(now, "scheduling pass", self.schedule)
        progress = self.last = self.progress()
        if progress.converged:
            self._converge(now, progress)
            return IDLE_CHECK_SECONDS
        if self.last_report is None or now - self.last_report >= self.report_every:
            self._say(now, progress_text(progress, self.expected_nodes))
            self.last_report = now
        return max(self.last_kick + self.kick_every - now, 0.0)

    def _converge(self, now: float, progress: DemoProgress) -> None:
        self.phase = Phase.CONVERGED
        self.converged_after = now - self.started_at
        holding = progress.ready_indices_per_node
        self.say(
            f"[demo] converged in {clock_text(self.converged_after)}: "
            f"{progress.namespaces_ready}/{progress.enabled_namespaces} namespaces ready "
            f"on {len(holding)} nodes; dashboard at {self.dashboard_url}"
        )
        self.say(
            "[demo] ready indices per node: "
            + " · ".join(f"{name} {count}" for name, count in sorted(holding.items()))
        )
        for line in self._guarded(now, "sign-in lines", self.sign_in) or ():
            self.say(f"[demo] {line}")
        self._idle_seen = self._idle_key(progress)

    def _idle(self, now: float) -> float:
        progress = self.last = self.progress()
        key = self._idle_key(progress)
        if key != self._idle_seen:
            self._idle_seen = key
            self._say(now, progress_text(progress, self.expected_nodes))
        return IDLE_CHECK_SECONDS

    @staticmethod
    def _idle_key(progress: DemoProgress) -> tuple:
        return (
            progress.nodes_online,
            progress.nodes,
            progress.namespaces_ready,
            progress.enabled_namespaces,
        )

    def _guarded(self, now: float, what: str, call: Callable[[], Any]) -> Any:
        """Run ``call``; a failure is printed and the loop goes on (the next pass retries)."""
        try:
            return call()
        except Exception as exc:  # one failed pass must not stop the demo
            self._say(now, f"{what} failed: {exc.__class__.__name__}: {exc}")
            return None


class Command(BaseCommand):
    help = (
        "Demo: wait for the fake nodes, roll out, and run a scheduling pass every few "
        "seconds until every enabled namespace has a ready replica; then idle until stopped."
    )

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=5, help="nodes to wait for (5)")
        parser.add_argument(
            "--wait-nodes-timeout",
            type=float,
            default=120.0,
            metavar="SECONDS",
            help="go on with the nodes online after this long (120)",
        )
        parser.add_argument(
            "--kick-every",
            type=float,
            default=2.0,
            metavar="SECONDS",
            help="seconds between scheduling passes until converged (2; beat's are 60 apart)",
        )
        parser.add_argument(
            "--rollout-every",
            type=float,
            default=20.0,
            metavar="SECONDS",
            help="seconds between rollouts while a namespace has no replica (20)",
        )
        parser.add_argument("--report-every", type=float, default=5.0, metavar="SECONDS")
        parser.add_argument("--dashboard-url", default=DASHBOARD_URL)
        parser.add_argument(
            "--log-level",
            default="WARNING",
            help="log level of this process (WARNING: the log lines of the rollouts and "
            "scheduled tasks it runs are left out, the [demo] lines say what they did)",
        )

    def handle(self, *args, **options):
        logging.getLogger().setLevel(options["log_level"].upper())
        stop = threading.Event()

        def on_signal(_signum, _frame):
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        driver = DemoDriver(
            expected_nodes=options["nodes"],
            wait_nodes_timeout=options["wait_nodes_timeout"],
            kick_every=options["kick_every"],
            rollout_every=options["rollout_every"],
            report_every=options["report_every"],
            dashboard_url=options["dashboard_url"],
            say=say,
        )
        while not stop.is_set():
            # A long-lived process: drop a connection the server closed, as a request would.
            close_old_connections()
            try:
                delay = driver.tick(time.monotonic())
            except Exception as exc:  # e.g. the database restarting
                print(f"[demo] pass failed: {exc.__class__.__name__}: {exc}", file=sys.stderr)
                delay = driver.kick_every
            stop.wait(delay)
        close_old_connections()
