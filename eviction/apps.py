from django.apps import AppConfig


class EvictionConfig(AppConfig):
    """Eviction with safeguards: the decisions as records, the policy, the jobs."""

    name = "eviction"
    verbose_name = "Eviction"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The eviction events are dispatched by their registered names
        # (``zoekt.scheduling.events``): the task module is imported in every process, so
        # the name is registered outside a worker too.
        from eviction import tasks  # noqa: F401
