from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    """The engine: workflow declarations, executor, leases, restore, side effects."""

    name = "runtime"
    default_auto_field = "django.db.models.BigAutoField"
