from django.apps import AppConfig


class ConsumersAppConfig(AppConfig):
    name = "consumers_app"
    verbose_name = "Rebalance Lab engine"
    default_auto_field = "django.db.models.BigAutoField"
