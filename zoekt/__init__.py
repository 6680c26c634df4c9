"""zoekt-control's Django project package and the fleet domain.

The project side lives here (``settings``, ``celery``, ``urls``, ``wsgi``) next
to the fleet domain: GitLab's Zoekt tables and the slice of GitLab's core model
that planning reads (``models``), the named queries and capacity arithmetic
over them (``querysets``, ``capacity``), the application-settings row and its
accessor (``app_settings``), the node metadata schema (``metadata_schema``),
the one clock (``clock``), advisory-lock keys (``locks``), stable reason codes
(``reasons``), state changes (``actions``), the after-commit enqueues they
start jobs through (``hooks``) and the periodic jobs (``tasks``).

Nothing here imports the other apps (``planner``, ``eviction``, ``api``,
``dashboard``, ``simulator``) except the wiring that connects them
(``settings``, ``urls``, ``wsgi``, ``celery``); ``tests/test_layering.py``
checks it.
"""

from .celery import app as celery_app

__all__ = ["celery_app"]
