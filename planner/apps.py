from django.apps import AppConfig


class PlannerConfig(AppConfig):
    """The planner's database edge: only the rollout plan records are tables of its own."""

    name = "planner"
    verbose_name = "Planner"
    default_auto_field = "django.db.models.BigAutoField"
