from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The operator's read side; its one table is the node history (``dashboard.models``)."""

    name = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        # ``dashboard.record_node_history`` runs from beat by name: the task module is
        # imported in every process, so the name is registered outside a worker too.
        from dashboard import tasks  # noqa: F401
