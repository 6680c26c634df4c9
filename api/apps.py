from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    verbose_name = "Node and operator APIs"

    def ready(self) -> None:
        from axes.signals import user_locked_out

        from api import logins, schema  # noqa: F401  (schema registers the OpenAPI extensions)

        user_locked_out.connect(logins.log_lockout, dispatch_uid="api.logins.log_lockout")
