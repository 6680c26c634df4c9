"""GitLab's Zoekt fleet domain.

GitLab's Zoekt tables and the slice of GitLab's core model that planning reads
(``models``), the named queries and capacity arithmetic over them
(``querysets``, ``capacity``), the application-settings row and its accessor
(``app_settings``), the node metadata schema (``metadata_schema``), the one
clock (``clock``), advisory-lock keys (``locks``), stable reason codes
(``reasons``), state changes (``actions``), the after-commit enqueues they
start jobs through (``hooks``) and the periodic jobs (``tasks``).

Nothing here imports another app (``planner``, ``eviction``, ``api``,
``gitlab_sync``, ``dashboard``, ``simulator``) or the wiring (``config``);
``tests/test_layering.py`` checks it.
"""
