from django.apps import AppConfig


class EvictionConfig(AppConfig):
    """Eviction with safeguards: the decisions as records, the policy, the jobs."""

    name = "eviction"
    verbose_name = "Eviction"
    default_auto_field = "django.db.models.BigAutoField"
