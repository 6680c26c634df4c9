from django.apps import AppConfig


class ZoektConfig(AppConfig):
    name = "zoekt"
    verbose_name = "Zoekt fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The settings' cache-invalidation signals, and the domain's Celery tasks,
        # registered by name for the after-commit enqueues of zoekt.hooks.
        from zoekt import app_settings, tasks  # noqa: F401
        from zoekt.scheduling import tasks as scheduling_tasks  # noqa: F401
