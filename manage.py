#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    from django.conf import settings
    from django.core.management import execute_from_command_line

    from portal.env import SettingError

    # Load the settings here so a bad one ends the command with its one-line reason; Django's
    # command runner would otherwise swallow it or bury it under a traceback of its own frames.
    try:
        settings.INSTALLED_APPS  # noqa: B018
    except SettingError as error:
        sys.exit(f"Bad setting: {error}")
    execute_from_command_line(sys.argv)
