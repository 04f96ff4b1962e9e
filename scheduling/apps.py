from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    """Periodic jobs that stay single when more than one ``celery beat`` runs."""

    name = "scheduling"
    default_auto_field = "django.db.models.BigAutoField"
