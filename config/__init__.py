"""The project's wiring: settings, the Celery app, the URL root, the WSGI entry and the
embedded-servers launcher (``python -m config.devservers``).

It connects the apps and may import any of them; no app imports it
(``tests/test_layering.py`` checks both). Loading the settings loads this
package, so the Celery app exists before any task module is imported.
"""

from .celery import app as celery_app

__all__ = ["celery_app"]
