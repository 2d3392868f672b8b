#!/usr/bin/env python
"""Django's command-line utility for Waymark."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waymark_config.settings")
    try:
        from django.core.exceptions import ImproperlyConfigured
        from django.core.management import execute_from_command_line
    except KeyboardInterrupt:
        interrupted()

    try:
        execute_from_command_line(sys.argv)
    except KeyboardInterrupt:
        # Ctrl-C before the command took SIGINT for itself (loading Django and the apps,
        # reading the settings) or after it gave it back: one line, not a traceback.
        interrupted()
    except ImproperlyConfigured as error:
        # A setting the operator gave that cannot work (waymark_config/settings.py says which and
        # why): that one line, not a traceback, and sysexits' EX_CONFIG, on which runengine's
        # supervisor stops with the reason instead of restarting the process.
        from workflows.engine.supervisor import EXIT_CONFIG

        sys.stderr.write(f"{error}\n")
        sys.exit(EXIT_CONFIG)


def interrupted() -> None:
    from waymark_config.exit_codes import exit_interrupted

    exit_interrupted()


if __name__ == "__main__":
    main()
