from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The operator's read side; it has no tables of its own."""

    name = "dashboard"
    verbose_name = "Dashboard"
