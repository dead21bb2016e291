"""Where the Celery app reads its configuration: Django's settings, loaded through
settings_or_exit when Celery first reads them, so a bad one ends `celery -A portal worker` (or
beat) with one line. Importing the portal package (the CLI does) loads no settings."""

from django.conf import settings

from portal.env import settings_or_exit

settings_or_exit()

__all__ = ["settings"]
