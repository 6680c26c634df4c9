from django.apps import AppConfig


class GitlabSyncConfig(AppConfig):
    """Following a real GitLab: the REST sweep and its records (docs/gitlab.md)."""

    name = "gitlab_sync"
    verbose_name = "GitLab"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The hook job is enqueued by name after a hook commits, and beat names it: its
        # module is imported in every process, so the name is registered outside a worker.
        from gitlab_sync import tasks  # noqa: F401
