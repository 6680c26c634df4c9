"""The broker's visibility timeout as shipped: a killed job's message is handed to another
worker within 5 minutes (the timeout plus one scan for unacknowledged messages), read
from the settings of a process started without ``ZOEKT_CELERY_VISIBILITY_TIMEOUT``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIVE_MINUTES = 300


def shipped_transport_options() -> dict:
    script = (
        "import django, json\n"
        "django.setup()\n"
        "from django.conf import settings\n"
        "print(json.dumps(settings.CELERY_BROKER_TRANSPORT_OPTIONS))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    env.pop("ZOEKT_CELERY_VISIBILITY_TIMEOUT", None)
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_killed_job_comes_back_within_five_minutes_with_the_shipped_settings():
    options = shipped_transport_options()

    assert options["visibility_timeout"] == 240
    assert options["visibility_timeout"] + options["unacked_restore_interval"] < FIVE_MINUTES
