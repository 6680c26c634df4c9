from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The operator's read side; its one table is the node history (``dashboard.models``)."""

    name = "dashboard"
    verbose_name = "Dashboard"
