#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    from django.core.management import execute_from_command_line

    from portal.env import settings_or_exit

    # Load the settings here so a bad one ends the command with its one-line reason; Django's
    # command runner would otherwise swallow it or bury it under a traceback of its own frames.
    settings_or_exit()
    execute_from_command_line(sys.argv)
