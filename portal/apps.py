from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Cached token -> user entries are dropped the moment a token or its user changes.
        from portal.api import auth  # noqa: F401
