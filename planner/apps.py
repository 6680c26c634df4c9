from django.apps import AppConfig


class PlannerConfig(AppConfig):
    """The planner's database edge: only the rollout plan records are tables of its own."""

    name = "planner"
    verbose_name = "Planner"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # ``zoekt.rollout`` is enqueued by name (beat, the admin's "plan now"): the task
        # module is imported in every process, so the name is registered outside a worker
        # too.
        from planner import tasks  # noqa: F401
