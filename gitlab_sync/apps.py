from django.apps import AppConfig


class GitlabSyncConfig(AppConfig):
    """Following a real GitLab: the REST sweep and its records (docs/gitlab.md)."""

    name = "gitlab_sync"
    verbose_name = "GitLab"
    default_auto_field = "django.db.models.BigAutoField"
