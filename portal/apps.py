from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Logins and failed logins are written to the audit log; cached token -> user entries
        # are dropped the moment a token or its user changes.
        from portal import audit_signals  # noqa: F401
        from portal.api import auth  # noqa: F401
