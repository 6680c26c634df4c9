from django.apps import AppConfig


class ZoektConfig(AppConfig):
    name = "zoekt"
    verbose_name = "Zoekt fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from zoekt import app_settings  # noqa: F401  (connects the cache-invalidation signals)
