"""The operator's read side: the dashboard's pages, its read models and charts, ``/metrics``.

It reads every app (``zoekt``, ``planner``, later ``eviction``) and no app
imports it. ``views`` renders the pages inside the admin from ``readmodels``
(a fixed number of queries each) with the inline SVG of ``charts``;
``templatetags.zoekt_dashboard`` formats their figures; ``metrics`` is the
Prometheus exposition; ``management/commands/zoekt_info.py`` is GitLab's
``gitlab:zoekt:info``. The templates live under ``templates/zoekt/dashboard/``.
"""
