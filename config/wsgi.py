"""WSGI entry point for gunicorn (``gunicorn config.wsgi``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = get_wsgi_application()

from api.authentication import require_shell_secrets  # noqa: E402

# Serving nodes without a shared secret would reject every heartbeat: refuse to start.
require_shell_secrets()
