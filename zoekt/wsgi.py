"""WSGI entry point for gunicorn (``gunicorn zoekt.wsgi``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "zoekt.settings")

application = get_wsgi_application()
