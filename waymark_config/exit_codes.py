"""Exit codes the processes agree on. Here, in config, so that config's modules (the web
server) and the engine's (the supervisor, manage.py) read one definition without config
importing the apps."""

import sys
from typing import NoReturn

# sysexits' EX_CONFIG: the configuration is wrong. A process that exits with it is not
# restarted by runengine's supervisor (it would fail the same way every time).
EXIT_CONFIG = 78

# 128 + SIGINT, as a shell reports a command Ctrl-C stopped: a command interrupted (Ctrl-C)
# exits with it, with one line (``interrupted``), never a traceback, whatever it was doing.
EXIT_INTERRUPTED = 130


def exit_interrupted(what: str = "") -> NoReturn:
    """End a process Ctrl-C stopped: its one line on stderr (``interrupted``, then what
    became of its work, when said) and EXIT_INTERRUPTED."""
    sys.stderr.write(f"interrupted: {what}\n" if what else "interrupted\n")
    sys.exit(EXIT_INTERRUPTED)
