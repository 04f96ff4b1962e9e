from django.apps import AppConfig


class ApiConfig(AppConfig):
    """HTTP API v1: DRF views and serializers over the store, the engine and approvals."""

    name = "api"
    default_auto_field = "django.db.models.BigAutoField"
