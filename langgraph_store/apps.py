from django.apps import AppConfig


class LangGraphStoreConfig(AppConfig):
    name = "langgraph_store"
    label = "langgraph_store"
    verbose_name = "LangGraph threads"
    default_auto_field = "django.db.models.BigAutoField"
