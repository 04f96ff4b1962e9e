from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # drf-spectacular finds authentication extensions by import.
        from tenants import schema  # noqa: F401
