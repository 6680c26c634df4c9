"""Bring the catalog to what a real GitLab holds: ``manage.py zoekt_gitlab_sync``.

Walks GitLab's REST API with python-gitlab (``gitlab_sync.sweep``): groups and their
descendants, personal namespaces, every project with its statistics, then removes
what GitLab no longer has. A sweep that was interrupted (Ctrl-C, a crash, GitLab
down) is resumed where it stopped by the next run; ``--restart`` starts over. ``--delta``
reads only what changed since the last complete sweep and removes nothing (beat runs
one every five minutes, and a full sweep daily).

The URL and the token file come from ``--url`` / ``--token-file`` or the environment
(``ZOEKT_GITLAB_URL``, ``ZOEKT_GITLAB_TOKEN_FILE``); the token is an administrator's
with the ``read_api`` scope. Progress goes to stderr, a line per batch; ``--json``
prints the sweep's record at the end. Exit code 1 when the sweep failed (its record
says why), 0 when it completed, 130 when interrupted.
"""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from gitlab_sync import sweep


class Command(BaseCommand):
    help = "Sweep a GitLab instance into the catalog (resumes an interrupted sweep)."

    def add_arguments(self, parser):
        parser.add_argument("--url", help="GitLab's base URL (ZOEKT_GITLAB_URL)")
        parser.add_argument(
            "--token-file", help="a file holding an admin read_api token (ZOEKT_GITLAB_TOKEN_FILE)"
        )
        parser.add_argument("--restart", action="store_true", help="abandon a running sweep")
        parser.add_argument(
            "--delta",
            action="store_true",
            help="only what changed since the last complete sweep (removes nothing)",
        )
        parser.add_argument(
            "--allow-mass-removal",
            action="store_true",
            help="remove what GitLab no longer has even above ZOEKT_GITLAB_MAX_REMOVAL_FRACTION",
        )
        parser.add_argument("--json", action="store_true", help="print the sweep's record")
        parser.add_argument("--quiet", action="store_true", help="no progress lines")

    def handle(self, *args, **options):
        try:
            config = sweep.Config.from_settings(
                options["url"],
                options["token_file"],
                allow_mass_removal=options["allow_mass_removal"],
            )
        except sweep.SweepError as exc:
            raise CommandError(str(exc)) from exc

        def progress(line: str) -> None:
            if not options["quiet"]:
                print(f"[gitlab] {line}", file=sys.stderr, flush=True)

        try:
            record = sweep.run(
                config,
                restart=options["restart"],
                progress=progress,
                kind="delta" if options["delta"] else "full",
            )
        except sweep.SweepError as exc:
            if options["json"]:
                self._print(sweep.Sweep.objects.order_by("-id").first())
            raise CommandError(f"sweep failed: {exc}", returncode=1) from exc
        except KeyboardInterrupt as exc:
            raise CommandError(
                "interrupted: the next run resumes this sweep", returncode=130
            ) from exc
        if options["json"]:
            self._print(record)
        else:
            c = record.counts
            removed = c.get("removed", {})
            self.stdout.write(
                f"{record.kind} sweep {record.id} complete: {c['groups']:,} groups, "
                f"{c['users']:,} users, {c['projects']:,} projects written; "
                f"{c['skipped']:,} skipped; removed "
                f"{removed.get('projects', 0):,} projects and "
                f"{removed.get('namespaces', 0):,} namespaces; {c['requests']:,} requests"
            )

    def _print(self, record) -> None:
        if record is None:
            return
        self.stdout.write(
            json.dumps(
                {
                    "id": record.id,
                    "state": record.state,
                    "phase": record.phase,
                    "started_at": record.started_at.isoformat(),
                    "finished_at": record.finished_at.isoformat() if record.finished_at else None,
                    "cursor": record.cursor,
                    "counts": record.counts,
                    "error": record.error,
                },
                indent=2,
            )
        )
