"""Exit codes the processes agree on. Here, in config, so that config's modules (the web
server) and the engine's (the supervisor, manage.py) read one definition without config
importing the apps."""

# sysexits' EX_CONFIG: the configuration is wrong. A process that exits with it is not
# restarted by runengine's supervisor (it would fail the same way every time).
EXIT_CONFIG = 78

# 128 + SIGINT, as a shell reports a command Ctrl-C stopped: a command interrupted (Ctrl-C)
# exits with it, with one line (``interrupted``), never a traceback, whatever it was doing.
EXIT_INTERRUPTED = 130
