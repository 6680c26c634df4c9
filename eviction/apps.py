from django.apps import AppConfig


class EvictionConfig(AppConfig):
    """Eviction with safeguards: the decisions as records, the policy, the jobs."""

    name = "eviction"
    verbose_name = "Eviction"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The eviction events are dispatched by the scheduling service through the table
        # registered here (zoekt imports nothing of eviction). The task module is imported
        # in every process, so the tasks are registered outside a worker too.
        from eviction import tasks
        from zoekt.scheduling import events

        events.register_events(tasks.EVICTION_EVENTS)
